"""Adapters that take the tool call id from an agent framework and guard its tool calls.

Each adapter is a module of its own behind its own extra, and only that module imports its
framework: ``airlock_redis.integrations.langchain`` (``airlock-redis[langchain]``),
``airlock_redis.integrations.openai_agents`` (``airlock-redis[openai-agents]``) and
``airlock_redis.integrations.mcp`` (``airlock-redis[mcp]``). Importing this package imports none.
"""

from __future__ import annotations
