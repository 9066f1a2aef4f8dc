"""The Lua transitions, read from the ``lua`` folder shipped with the package.

An installed wheel carries them as ``airlock_redis/lua``; a source checkout (or an editable
install) reads the project's top-level ``lua/`` folder.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

SCRIPT_NAMES = ("begin", "commit", "settle", "resolve", "renew", "wait", "claim", "unclaim")
COMMON = "common"  # helpers every script shares, prepended to each (not a script of its own)


def _lua_folder() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / "begin.lua").is_file():
            return candidate
    raise FileNotFoundError(
        f"the Lua scripts are missing: looked in {package / 'lua'} and {package.parent / 'lua'}"
    )


# A script may run a block before the shared helpers are defined: its source then has this line
# between the two, and the helpers go there instead of at the top. Defining the helpers is part of
# every run of a script (Lua runs a script's whole chunk each time), about a third of the commit's
# server time, so a common case that needs none of them returns before they are made.
HELPERS_HERE = "-- (the shared helpers are defined here)"


@cache
def script_source(name: str) -> str:
    """The script as the server runs it: the shared helpers, then the script, without comments
    or indentation (see :func:`compact`); a block before :data:`HELPERS_HERE` runs first."""
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    folder = _lua_folder()
    text = (folder / f"{name}.lua").read_text(encoding="utf-8")
    return assemble(name, text, (folder / f"{COMMON}.lua").read_text(encoding="utf-8"))


def assemble(name: str, text: str, common: str) -> str:
    """Script ``name`` as the server runs it, from its source ``text`` and the shared helpers'
    ``common``: the helpers it uses placed at :data:`HELPERS_HERE` (or first), all compacted. A
    script that uses a helper before that line is refused (``ValueError``): it would read an
    undefined global there, which Redis refuses only when the line runs."""
    first, _, rest = text.rpartition("\n" + HELPERS_HERE + "\n")
    first, body = compact(first), compact(rest)
    early = set(_WORD.findall(first)) & {m.group(1) for m in _DEFINITION.finditer(common)}
    if early:
        raise ValueError(f"{name}.lua uses shared helpers before they are defined: {sorted(early)}")
    return (first if first.strip() else "") + helpers_for(common, body) + body


_DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z_]\w*")


def helpers_for(common: str, body: str) -> str:
    """The definitions of ``common`` (the shared helpers' source) that the compacted ``body`` uses,
    directly or through another one, compacted, in their order. A definition runs from a line that
    starts with ``local`` (unindented) to the next one."""
    found = list(_DEFINITION.finditer(common))
    starts, names = [m.start() for m in found], [m.group(1) for m in found]
    if not starts or compact(common[: starts[0]]).strip():
        raise ValueError("the shared Lua helpers must be top-level local definitions only")
    chunks = [compact(common[a:b]) for a, b in zip(starts, [*starts[1:], len(common)], strict=True)]
    wanted, taken = set(_WORD.findall(body)), [False] * len(chunks)
    grew = True
    while grew:
        grew = False
        for i, name in enumerate(names):
            if not taken[i] and name in wanted:
                taken[i], grew = True, True
                wanted |= set(_WORD.findall(chunks[i]))
    return "".join(chunk for chunk, take in zip(chunks, taken, strict=True) if take)


@cache
def script_bytes(name: str) -> bytes:
    """:func:`script_source` encoded once (the transitions send it with every EVAL)."""
    return script_source(name).encode("utf-8")


def compact(lua: str) -> str:
    """``lua`` without its comments, blank lines and indentation: the transitions that end a call
    travel with their source (EVAL), so every byte is sent and hashed by the server on every call,
    and under redis-py's 6,000-byte cut-off the command goes out in one write. Lines stay lines (Lua
    reports errors by line). Handles what the scripts use: quoted strings with backslash escapes, and
    ``--`` comments to the end of a line; a long bracket (``[[``, ``--[[``) is refused, not guessed."""
    lines = []
    for line in lua.splitlines():
        code = _code_of(line).strip()
        if code:
            lines.append(code)
    return "\n".join(lines) + "\n"


def _code_of(line: str) -> str:
    """The part of one line before a comment that starts outside a string."""
    quote = ""
    i = 0
    while i < len(line):
        char = line[i]
        if quote:
            if char == "\\":
                i += 2
                continue
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif line.startswith("[[", i) or line.startswith("[=", i):
            raise ValueError(f"a Lua long bracket is not supported here: {line!r}")
        elif line.startswith("--", i):
            if line.startswith(("--[[", "--[="), i):
                raise ValueError(f"a Lua block comment is not supported here: {line!r}")
            return line[:i]
        i += 1
    if quote:
        raise ValueError(f"a string runs past the end of the line: {line!r}")
    return line
