"""What the bench calls: its configuration, the guarded tools and their bodies, and which call (tool,
arguments, tool_call_id) comes next.

The tools are a weighted mix (:data:`TOOLS`), most of them not reversible. Call ``seq`` of process
``p`` is rebuilt from ``(p, seq)`` alone (:func:`call_for`), so any process can retry any earlier call:
a share ``duplicate_rate`` of the calls re-use the tool_call_id (with the same tool and arguments) of
an earlier call of any process. The tool bodies count their real executions by tool_call_id in the
process; the run merges the counts, so a call that ran twice shows up whichever processes ran it.
"""

from __future__ import annotations

import contextvars
import functools
import random
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..context import current_call_context
from ..core.reversibility import ReversibilityName, reversibility
from ..redaction import redact
from .stats import MODES

if TYPE_CHECKING:
    from ..guard import EffectGuard

# (tool, weight, reversibility): mixed tools, most of them not reversible
TOOLS: tuple[tuple[str, int, ReversibilityName], ...] = (
    ("charge", 5, "irreversible"),
    ("send_email", 3, "costly"),
    ("read_balance", 2, "reversible"),
)
_WEIGHTED = [name for name, weight, _ in TOOLS for _ in range(weight)]
REVERSIBLE_TOOLS = frozenset(name for name, _, tag in TOOLS if tag == "reversible")
# set by a lane around each call: the tool body marks it, so a call that returned tells an execution
# from a replay (a holder in a context variable: each thread and each coroutine's task has its own)
EXECUTED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "airlock_bench_executed", default=None
)
# set by a lane around each call too: the guard's observer marks it when the call waited for a running
# attempt of its id (the "waited" event), so the lane can count what such calls got
WAITED: contextvars.ContextVar[list[bool] | None] = contextvars.ContextVar(
    "airlock_bench_waited", default=None
)


class WaitWatcher:
    """The guard's observer in a bench worker: notes the ``waited`` event of the current call (a
    duplicate that waited for a running attempt of its id, then went on) and nothing else."""

    def call_event(
        self,
        event: str,
        tool: str,
        tool_call_id: str | None,
        *,
        reason: str | None = None,
        attempt: int | None = None,
        duration_s: float | None = None,
        stored: bool | None = None,
    ) -> None:
        if event == "waited":
            holder = WAITED.get()
            if holder is not None:
                holder[0] = True

    def store_operation(self, operation: str, duration_s: float | None, error: BaseException | None) -> None:
        pass


@dataclass(frozen=True)
class BenchConfig:
    url: str
    cluster: bool = False  # informational: the URL's scheme decides the topology (kept for old callers)
    processes: int = 2
    concurrency: int = 8  # lanes per process: threads, or coroutines on the process's event loop
    duration: float | None = 6.0  # seconds; None when ``calls`` bounds the run
    calls: int | None = None  # total guarded calls over all lanes
    duplicate_rate: float = 0.1
    value_bytes: int = 256
    namespace: str = "airlock:bench"
    run_id: str = ""
    mode: str = "threads"  # "threads": blocking calls; "asyncio": coroutines on one event loop
    auto_pipeline: bool = True  # asyncio: RedisEffectStore(auto_pipeline=); threads: must stay True
    write_behind: bool = False  # RedisEffectStore(write_behind=): commits queued, sent by a background sender
    lease: bool = True  # EffectGuard's default lease (60 s; a duplicate of a running call waits); False: None

    def __post_init__(self) -> None:
        if self.processes < 1 or self.concurrency < 1:
            raise ValueError("processes and concurrency must be at least 1")
        if (self.duration is None) == (self.calls is None):
            raise ValueError("give exactly one of duration and calls")
        if self.duration is not None and self.duration <= 0:
            raise ValueError("duration must be positive")
        if self.calls is not None and self.calls < 1:
            raise ValueError("calls must be at least 1")
        if not 0.0 <= self.duplicate_rate < 1.0:
            raise ValueError("duplicate_rate must be in [0, 1)")
        if self.value_bytes < 0:
            raise ValueError("value_bytes must be >= 0")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.mode == "threads" and not self.auto_pipeline:
            raise ValueError(
                "auto-pipelining applies to the asyncio mode only: blocking calls are always sent one by one"
            )

    def shown(self) -> dict[str, Any]:
        """The configuration as the report shows it: the URL redacted, and ``auto_pipeline`` None
        (not applicable) in the threads mode. ``write_behind`` and ``lease`` as given."""
        shown = asdict(self)
        shown["url"] = redact(self.url)
        if self.mode == "threads":
            shown["auto_pipeline"] = None
        return shown


def call_for(process: int, seq: int) -> tuple[str, dict[str, Any]]:
    """The tool and arguments of call ``seq`` of ``process``: any process can rebuild a retry."""
    rng = random.Random(process * 1_000_003 + seq)
    tool = rng.choice(_WEIGHTED)
    account = f"acct_{rng.randrange(1000)}"
    if tool == "charge":
        return tool, {"account": account, "cents": rng.randrange(1, 100_000)}
    if tool == "send_email":
        return tool, {"to": f"user{rng.randrange(1000)}@example.com", "subject": f"order {seq}"}
    return tool, {"account": account}


def tool_of(tool_call_id: str) -> str:
    """The tool of a bench tool_call_id (``<run>-<process>-<seq>``)."""
    _, process, seq = tool_call_id.rsplit("-", 2)
    return call_for(int(process), int(seq))[0]


def _awaitable(body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` as an ``async def`` tool with its signature and annotations (it returns at once)."""

    @functools.wraps(body)
    async def tool(*args: Any, **kwargs: Any) -> Any:
        return body(*args, **kwargs)

    return tool


def guarded_tools(
    guard: EffectGuard,
    value_bytes: int,
    runs: dict[str, int],
    lock: threading.Lock,
    *,
    asynchronous: bool = False,
) -> dict[str, Callable[..., Any]]:
    """The guarded tools by name: blocking, or (``asynchronous``) ``async def`` with the same bodies."""
    payload = "x" * value_bytes

    def ran() -> str:
        host = current_call_context()
        tool_call_id = str(host.tool_call_id) if host is not None else ""
        with lock:
            runs[tool_call_id] = runs.get(tool_call_id, 0) + 1
        executed = EXECUTED.get()
        if executed is not None:
            executed[0] = True
        return tool_call_id

    def charge(account: str, cents: int) -> dict[str, Any]:
        return {"receipt": ran(), "account": account, "cents": cents, "payload": payload}

    def send_email(to: str, subject: str) -> dict[str, Any]:
        return {"message_id": ran(), "to": to, "payload": payload}

    def read_balance(account: str) -> dict[str, Any]:
        return {"account": account, "balance": 4200, "read": ran(), "payload": payload}

    bodies: dict[str, Callable[..., Any]] = {
        "charge": charge,
        "send_email": send_email,
        "read_balance": read_balance,
    }
    tools: dict[str, Callable[..., Any]] = {}
    for name, _, tag in TOOLS:  # an untagged tool is irreversible: the tag changes nothing for charge
        body = _awaitable(bodies[name]) if asynchronous else bodies[name]
        tools[name] = reversibility(tag)(guard.wrap(body, name=name))
    return tools
