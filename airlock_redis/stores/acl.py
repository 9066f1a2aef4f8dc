"""What a Redis user needs to be allowed for the effect store to work: one list, read by the store's
first-use check, by ``doctor`` and by the ACL recipe in docs/security.md.

Every command here runs on the record keys (``<namespace>:{<tag>}:<tool_call_id>``) or on none.
"""

from __future__ import annotations

# Sent by the store itself on the record keys: begin (SET NX, or the begin script), the transitions
# (EVAL with the script's source, so that one that lands late still runs on an emptied script cache),
# the replay read (GET and PTTL in one pipeline).
CLIENT_COMMANDS: tuple[str, ...] = ("get", "set", "pttl", "evalsha", "eval", "ping")

# Called from inside the Lua scripts: a user must be allowed these too (ACLs apply inside scripts).
SCRIPT_COMMANDS: tuple[str, ...] = ("get", "set", "del", "pexpire")

# Sent only with wait_replicas (WAITAOF only where every primary has an append-only file, 7.2+).
DURABILITY_COMMANDS: tuple[str, ...] = ("wait", "waitaof")

# On a Cluster: redis-py's cluster client reads the slot map (CLUSTER SLOTS) and the command table
# (COMMAND) when it connects, and sends ASKING to follow an -ASK while a slot migrates.
CLUSTER_COMMANDS: tuple[str, ...] = ("cluster|slots", "command", "asking")

# For a call that waits for a running attempt of its id (wait_for_running): the listener subscribes
# to the channel named as the record's key, and the scripts publish the attempt's end there (PUBLISH
# through pcall: refused, the write still happens). Granted with the channel pattern &<namespace>:{*.
# Without them nothing fails: a waiting call is not woken, and looks again when its wait or the lease
# runs out.
WAITING_COMMANDS: tuple[str, ...] = ("publish", "subscribe", "unsubscribe")

# Read once per store when allowed; refused, the store goes on without them (no eviction warning, and
# the default proto-max-bulk-len of 512 MB assumed).
OPTIONAL_COMMANDS: tuple[str, ...] = ("info", "config|get")


def required_commands(*, wait_replicas: bool = False, cluster: bool = False) -> tuple[str, ...]:
    """Every command the store cannot work without, each once, in a stable order."""
    wanted = CLIENT_COMMANDS + SCRIPT_COMMANDS
    wanted += DURABILITY_COMMANDS if wait_replicas else ()
    wanted += CLUSTER_COMMANDS if cluster else ()
    return tuple(dict.fromkeys(wanted))
