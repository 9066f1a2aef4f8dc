"""What both parts of ``airlock-redis demo`` share: the two-replica story (:mod:`.demo_cmd`) and the
story told by one agent of a real framework (:mod:`.demo_frameworks`).

The stand-in backend counts each tool's real executions in Redis, under keys of the run's namespace
that expire within :data:`DEMO_TTL`; :func:`clean` reads the counts and removes every key of the run.
Neither demo module imports the other at module level: both import this one (``demo_cmd`` imports
``demo_frameworks`` only when ``--framework`` asks for it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import cast

from ..stores.url import SyncClient, primary_clients, sync_client

DEMO_TTL = 3600.0  # seconds: every key of a run (records and counters) expires within this
# --framework -> (the integration module under airlock_redis.integrations, its extra, its name)
FRAMEWORKS: dict[str, tuple[str, str, str]] = {
    "langchain": ("langchain", "langchain", "LangChain"),
    "openai-agents": ("openai_agents", "openai-agents", "the OpenAI Agents SDK"),
}


def counter_key(namespace: str, tool: str) -> str:
    """The backend's execution counter of ``tool``: the ``{...}`` hash tag (the run's namespace) puts
    the counters of one run in one Cluster slot."""
    return f"{namespace}:executions:{{{namespace}}}:{tool}"


def backend_client(url: str) -> SyncClient:
    """A client of the stand-in backend (the execution counters), through the store's URL handling."""
    return sync_client(url, socket_timeout=10.0, socket_connect_timeout=10.0)


# KEYS[1] - an execution counter; ARGV[1] - its TTL in seconds
# returns the count: the INCR and its EXPIRE in one step, so no counter is ever left without a TTL
_COUNT_SCRIPT = """
local count = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
return count
"""


def count_execution(backend: SyncClient, namespace: str, tool: str) -> int:
    """One real execution of ``tool`` in this run, counted by the stand-in backend."""
    count = backend.eval(_COUNT_SCRIPT, 1, counter_key(namespace, tool), int(DEMO_TTL))
    return int(cast("int", count))


def execution_count(backend: SyncClient, namespace: str, tool: str) -> int:
    """How many times ``tool`` really ran in this run so far."""
    value = backend.get(counter_key(namespace, tool))
    return int(value) if value is not None else 0


def clean(url: str, namespace: str, tools: Sequence[str]) -> dict[str, int]:
    """The run's execution counts of ``tools``; then its keys are removed from every primary."""
    backend = backend_client(url)
    try:
        counts = {tool: execution_count(backend, namespace, tool) for tool in tools}
        backend.delete(*(counter_key(namespace, tool) for tool in tools))  # one slot: one DEL
        for _, node in primary_clients(backend):  # the records live in many slots, on every primary
            for key in node.scan_iter(match=f"{namespace}:*", count=1000):
                node.unlink(key)
    finally:
        backend.close()
    return counts


def say(text: str = "") -> None:
    """One line at a time, also into a pipe; line and newline in one write, so that a Ctrl-C between
    two writes cannot leave a line without its end (and ``interrupted`` glued to it)."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()
