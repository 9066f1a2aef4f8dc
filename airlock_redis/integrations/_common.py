"""What the framework integrations share: the extra a framework needs, which reversibility a tool
has, the text a model gets for a refusal, and running one framework tool call through the guard.

Imports no framework. Every integration guards a call the same way: the tool's body is whatever
the framework runs for it (a handler, an ``on_invoke_tool``); the guard sees a small callable named
after the tool, tagged with the tool's reversibility, whose keyword arguments are the arguments the
model sent (so the same id with other arguments is a ``policy_violation``).
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Awaitable, Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from ..context import refusing_in_doubt
from ..core.errors import EffectRefused
from ..core.probes import Probe, reconcile_with
from ..core.reversibility import (
    TAG_ATTRIBUTE,
    Reversibility,
    ReversibilityName,
    reversibility,
    reversibility_of,
)

if TYPE_CHECKING:
    from ..guard import EffectGuard

ReversibilityMap: TypeAlias = Mapping[str, "ReversibilityName | Reversibility"]
"""Tool name -> ``"reversible"``, ``"costly"`` or ``"irreversible"``, for tools the user does not own."""


def install_hint(extra: str) -> str:
    """The command that installs an integration's framework."""
    return f"pip install 'airlock-redis[{extra}]'"


def framework_missing(integration: str, *, extra: str) -> ImportError:
    """The error to raise (``from`` the original) when an integration's framework does not import::

    try:
        from some_framework import Thing
    except ImportError as exc:
        raise framework_missing("some_framework", extra="some-framework") from exc
    """
    return ImportError(
        f"airlock_redis.integrations.{integration} needs its framework, which is not installed "
        f"(or does not import): {install_hint(extra)}"
    )


def import_framework(module: str, *, extra: str, integration: str) -> ModuleType:
    """Import a framework module, or raise an ImportError that names the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise framework_missing(integration, extra=extra) from exc


def refusal_text(error: EffectRefused) -> str:
    """What the model gets in place of the tool's result when the guard refuses a call."""
    return error.model_message


def reversibility_levels(mapping: ReversibilityMap | None) -> dict[str, Reversibility]:
    """Check a ``reversibility=`` mapping once; a bad name or level raises here, not at call time."""
    levels: dict[str, Reversibility] = {}
    for name, level in (mapping or {}).items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"reversibility= maps tool names (non-empty str) to levels, not {name!r}")
        try:
            levels[name] = Reversibility(level)
        except ValueError:
            raise ValueError(
                f"reversibility[{name!r}] must be 'reversible', 'costly' or 'irreversible', not {level!r}"
            ) from None
    return levels


ProbeMap: TypeAlias = Mapping[str, Probe]
"""Tool name -> its probe (see :mod:`airlock_redis.core.probes`): asked when a call of it is in doubt."""


def probe_map(mapping: ProbeMap | None) -> dict[str, Probe]:
    """Check a ``reconcile=`` mapping once; a bad name or probe raises here, not at call time."""
    probes: dict[str, Probe] = {}
    for name, probe in (mapping or {}).items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"reconcile= maps tool names (non-empty str) to probes, not {name!r}")
        if not callable(probe):
            raise TypeError(f"reconcile[{name!r}] must be a probe function, not {probe!r}")
        probes[name] = probe
    return probes


def tag_of(source: Any) -> Reversibility | None:
    """The ``@reversibility`` tag found on ``source`` or along its ``__wrapped__`` chain, or None
    when it has none (where :func:`reversibility_of` would say irreversible)."""
    current, depth = source, 0
    while current is not None and depth < 64:
        if getattr(current, TAG_ATTRIBUTE, None) is not None:
            return reversibility_of(source)
        current, depth = getattr(current, "__wrapped__", None), depth + 1
    return None


# the body of the framework call the guard is running now (read by the tool's runner)
_body: contextvars.ContextVar[Callable[[], Any]] = contextvars.ContextVar("airlock_redis_integration_body")


class GuardedToolCalls:
    """Runs framework tool calls through ``guard``, keyed on the framework's tool call id.

    ``reversibility`` maps tool names to levels; for a tool it names, the mapping decides. Any other
    tool takes the strictest ``@reversibility`` tag found on the callables the integration passes
    to :meth:`level_of` (untagged: irreversible).
    """

    def __init__(
        self,
        guard: EffectGuard,
        reversibility: ReversibilityMap | None = None,
        reconcile: ProbeMap | None = None,
    ) -> None:
        self.guard = guard
        self.levels = reversibility_levels(reversibility)
        self.probes = probe_map(reconcile)
        self._runners: dict[tuple[str, Reversibility, bool], Callable[..., Any]] = {}

    def level_of(self, tool: str, *sources: Any) -> Reversibility:
        """The tool's reversibility: the mapping's entry, else the strictest ``@reversibility`` tag
        found on ``sources`` (None and untagged sources are skipped), else irreversible."""
        mapped = self.levels.get(tool)
        if mapped is not None:
            return mapped
        found = [level for level in map(tag_of, sources) if level is not None]
        return max(found) if found else Reversibility.IRREVERSIBLE

    def run(
        self,
        tool_call_id: str | None,
        tool: str,
        level: Reversibility,
        arguments: Mapping[str, Any],
        body: Callable[[], Any],
    ) -> Any:
        """Run ``body()`` guarded: the record names ``tool`` and ``arguments``. Returns what the body
        returned, or its stored result on a replay; raises :class:`EffectRefused` on a refusal and
        whatever else the body raised. An error of the body that leaves a tool that is not
        reversible in doubt (its record settles ``unknown``) is raised as an
        :class:`~airlock_redis.EffectStatusUnknown` (from that error), so the model is told on the
        first attempt not to call it again; a cancellation is raised as it is."""
        runner = self._runner(tool, level, asynchronous=False)
        token = _body.set(body)
        try:
            with refusing_in_doubt(tool_call_id):
                return self.guard.call(cast(str, tool_call_id), runner, **arguments)
        finally:
            _body.reset(token)

    async def arun(
        self,
        tool_call_id: str | None,
        tool: str,
        level: Reversibility,
        arguments: Mapping[str, Any],
        body: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Coroutine form of :meth:`run`: ``body()`` returns the awaitable to run."""
        runner = self._runner(tool, level, asynchronous=True)
        token = _body.set(body)
        try:
            with refusing_in_doubt(tool_call_id):
                return await self.guard.acall(cast(str, tool_call_id), runner, **arguments)
        finally:
            _body.reset(token)

    def _runner(self, tool: str, level: Reversibility, *, asynchronous: bool) -> Callable[..., Any]:
        """The callable the guard wraps for ``tool``: made once per name, level and kind."""
        key = (tool, level, asynchronous)
        runner = self._runners.get(key)
        if runner is None:
            runner = _make_runner(tool, level, asynchronous)
            probe = self.probes.get(tool)
            if probe is not None:
                runner = reconcile_with(probe)(runner)
            self._runners[key] = runner
        return runner


def _make_runner(tool: str, level: Reversibility, asynchronous: bool) -> Callable[..., Any]:
    # The arguments are what the guard records; the body comes from the context of this call.
    if asynchronous:

        async def run_async(**arguments: Any) -> Any:
            return await _body.get()()

        runner: Callable[..., Any] = run_async
    else:

        def run_sync(**arguments: Any) -> Any:
            return _body.get()()

        runner = run_sync
    runner.__name__ = runner.__qualname__ = tool
    return reversibility(level)(runner)
