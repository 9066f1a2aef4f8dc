"""``airlock-redis``: the command line. Each sub-command lives in a module of this package that
defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType

COMMANDS = ("demo", "bench", "doctor", "inspect", "list", "resolve", "audit")


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"airlock_redis.cli.{name}_cmd")
    except ModuleNotFoundError as exc:
        if exc.name == f"airlock_redis.cli.{name}_cmd":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="airlock-redis",
        description="At-most-once tool calls for AI agents, shared through Redis.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = _load(name)
        if module is None:
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args._run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    raise SystemExit(main())
