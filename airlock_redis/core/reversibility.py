"""The ``@reversibility`` tag and how the guard reads it.

The tag is static metadata on the tool. The guard reads it along the ``__wrapped__`` chain, so it
works above or below other decorators; where several tags are found the strictest wins, and a tool
with no tag is irreversible.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, Literal, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

TAG_ATTRIBUTE = "__airlock_reversibility__"
_MAX_CHAIN = 64


class Reversibility(str, enum.Enum):
    """How safely a tool can run twice. Ordered from least to most strict."""

    REVERSIBLE = "reversible"
    COSTLY = "costly"
    IRREVERSIBLE = "irreversible"

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]

    # Compare by strictness, not as strings (which would put "costly" < "irreversible" < "reversible").
    def __lt__(self, other: object) -> bool:
        if isinstance(other, Reversibility):
            return self.strictness < other.strictness
        return NotImplemented

    def __le__(self, other: object) -> bool:
        if isinstance(other, Reversibility):
            return self.strictness <= other.strictness
        return NotImplemented

    def __gt__(self, other: object) -> bool:
        if isinstance(other, Reversibility):
            return self.strictness > other.strictness
        return NotImplemented

    def __ge__(self, other: object) -> bool:
        if isinstance(other, Reversibility):
            return self.strictness >= other.strictness
        return NotImplemented

    @property
    def may_run_again(self) -> bool:
        """Only a reversible tool is run again after an attempt whose outcome is in doubt."""
        return self is Reversibility.REVERSIBLE


_STRICTNESS = {Reversibility.REVERSIBLE: 0, Reversibility.COSTLY: 1, Reversibility.IRREVERSIBLE: 2}
_BY_STRICTNESS = {level: tag for tag, level in _STRICTNESS.items()}
ReversibilityName = Literal["reversible", "costly", "irreversible"]


def reversibility(level: ReversibilityName | Reversibility) -> Callable[[F], F]:
    """Tag a tool as ``"reversible"``, ``"costly"`` or ``"irreversible"``.

    The decorator returns the same function with the tag attached; put it above or below
    ``@Airlock`` / ``guard.wrap``.
    """
    try:
        tag = Reversibility(level)
    except ValueError:
        raise ValueError(
            f"reversibility must be one of 'reversible', 'costly', 'irreversible', not {level!r}"
        ) from None

    def tag_tool(fn: F) -> F:
        existing = _own_tag(fn)
        if existing is not None and existing.strictness > tag.strictness:
            return fn
        try:
            setattr(fn, TAG_ATTRIBUTE, tag)
        except (AttributeError, TypeError) as exc:
            raise TypeError(f"cannot tag {fn!r} with @reversibility: {exc}") from exc
        return fn

    return tag_tool


def _own_tag(obj: Any) -> Reversibility | None:
    try:
        own = vars(obj).get(TAG_ATTRIBUTE)
    except TypeError:
        own = getattr(obj, TAG_ATTRIBUTE, None)
    return own if isinstance(own, Reversibility) else None


def reversibility_of(fn: Any) -> Reversibility:
    """The strictest tag found along ``fn``'s ``__wrapped__`` chain; untagged means irreversible.

    Runs on every guarded call (a tag may be added after decoration), so it stays a tight loop;
    the depth bound also ends a chain that loops back on itself.
    """
    strictest = -1
    current: Any = fn
    for _ in range(_MAX_CHAIN):
        own = getattr(current, "__dict__", None)
        tag = own.get(TAG_ATTRIBUTE) if own is not None else getattr(current, TAG_ATTRIBUTE, None)
        if tag is not None and tag.__class__ is Reversibility and _STRICTNESS[tag] > strictest:
            strictest = _STRICTNESS[tag]
        current = getattr(current, "__wrapped__", None)
        if current is None:
            break
    return _BY_STRICTNESS[strictest] if strictest >= 0 else Reversibility.IRREVERSIBLE
