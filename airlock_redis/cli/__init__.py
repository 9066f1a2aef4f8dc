"""``airlock-redis``: the command line. Each sub-command lives in a module of this package that
defines ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; its ``--help`` ends with its
exit codes.

What every command shares: one exit-code table (``common.EXIT_CODES_TABLE``, shown by ``--help``); a
bad command line is one line on stderr and exit 2 (not argparse's usage block); Ctrl-C is one line
and exit 130, after the command's clean-up has run; a reader that goes away (``airlock-redis demo |
head -2``) ends the command quietly with exit 141, as a Unix tool killed by SIGPIPE would, after its
clean-up has run. ``--version`` prints the version of the installed distribution."""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn

from .common import EXIT_CODES_TABLE

COMMANDS = ("demo", "bench", "doctor", "inspect", "list", "resolve", "audit")
DISTRIBUTION = "airlock-redis"

EXIT_USAGE = 2  # a bad command line (argparse's own code; common.EXIT_USAGE is the same)
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_READER_GONE = 141  # 128 + SIGPIPE: what a shell reports for a Unix tool whose reader went away


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad command line gets one line that says what is wrong and where help is."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def version() -> str:
    """The installed distribution's version (its metadata), not the package face's ``__version__``."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _load(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"airlock_redis.cli.{name}_cmd")
    except ModuleNotFoundError as exc:
        if exc.name == f"airlock_redis.cli.{name}_cmd":
            return None
        raise


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="airlock-redis",
        description="At-most-once tool calls for AI agents, shared through Redis.",
        epilog=f"{EXIT_CODES_TABLE}. Each command's --help lists the codes it uses.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        module = _load(name)
        if module is None:
            continue
        command = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def _reader_gone() -> int:
    """stdout's reader went away. Python flushes stdout once more at exit and would report that
    flush's broken pipe on stderr: point stdout at /dev/null first."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass  # stdout is not a file (a test's capture): nothing to flush at exit
    return EXIT_READER_GONE


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args._run(args)
        sys.stdout.flush()  # a pipe is block-buffered: its broken end shows here, inside the try
    except SystemExit as given_up:  # common._give_up: its one line is out; main() returns the code
        if isinstance(given_up.code, int):
            return given_up.code
        raise
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _reader_gone()
    return code


if __name__ == "__main__":
    raise SystemExit(main())
