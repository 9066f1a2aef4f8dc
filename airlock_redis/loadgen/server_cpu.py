"""How much server CPU a run cost: read before and after it on every primary.

Two figures, both per guarded call: the time Redis spent inside commands (``INFO commandstats``, the
begin and commit scripts and anything they call; what a sizing needs per call), and the whole
process's CPU (``INFO cpu``: user + system, so the network I/O and event loop too). The commands the
bench itself sends to measure (INFO, SCAN, MEMORY, CONFIG, ...) are left out of the first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

# the bench's own bookkeeping, not the guarded calls' work
_NOT_THE_CALLS = (
    "info",
    "scan",
    "memory",
    "config",
    "unlink",
    "ping",
    "hello",
    "client",
    "cluster",
    "command",
)


@dataclass(frozen=True)
class ServerCpu:
    """Totals over the primaries: microseconds inside commands, and seconds of process CPU."""

    command_us: float
    process_cpu_s: float

    def __sub__(self, before: ServerCpu) -> ServerCpu:
        return ServerCpu(self.command_us - before.command_us, self.process_cpu_s - before.process_cpu_s)


def command_us(commandstats: dict[str, Any]) -> float:
    """The microseconds spent in the commands of ``INFO commandstats`` that guarded calls send."""
    total = 0.0
    for name, stats in commandstats.items():
        command = name.removeprefix("cmdstat_").split("|")[0].lower()
        if command not in _NOT_THE_CALLS and isinstance(stats, dict):
            total += float(stats.get("usec", 0))
    return total


def snapshot(nodes: Iterable[Any]) -> ServerCpu:
    """The totals now, over ``nodes`` (redis clients of the primaries)."""
    commands = 0.0
    cpu = 0.0
    for node in nodes:
        commands += command_us(node.info("commandstats"))
        info = node.info("cpu")
        cpu += float(info.get("used_cpu_user", 0.0)) + float(info.get("used_cpu_sys", 0.0))
    return ServerCpu(commands, cpu)


def per_call(spent: ServerCpu, calls: int) -> tuple[float | None, float | None]:
    """(command µs per call, process CPU µs per call), None without calls."""
    if calls <= 0:
        return None, None
    return spent.command_us / calls, spent.process_cpu_s * 1e6 / calls
