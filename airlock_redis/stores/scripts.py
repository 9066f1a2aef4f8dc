"""The Lua transitions, read from the ``lua`` folder shipped with the package.

An installed wheel carries them as ``airlock_redis/lua``; a source checkout (or an editable
install) reads the project's top-level ``lua/`` folder.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

SCRIPT_NAMES = ("begin", "commit", "settle", "resolve")
COMMON = "common"  # helpers every script shares, prepended to each (not a script of its own)


def _lua_folder() -> Path:
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "lua", package.parent / "lua"):
        if (candidate / "begin.lua").is_file():
            return candidate
    raise FileNotFoundError(
        f"the Lua scripts are missing: looked in {package / 'lua'} and {package.parent / 'lua'}"
    )


@cache
def script_source(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(name)
    folder = _lua_folder()
    common = (folder / f"{COMMON}.lua").read_text(encoding="utf-8")
    return common + (folder / f"{name}.lua").read_text(encoding="utf-8")
