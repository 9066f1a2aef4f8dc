"""Every command block shown in README.md and docs/*.md runs as written, and every link between them
resolves.

The convention (also in docs/development.md, "The code blocks in these pages"):

- The line just before each fenced block is a marker: ``<!-- runnable -->`` or
  ``<!-- not-run: why -->``. A block without one fails :func:`test_every_block_is_marked`, so a new
  block is either run here or says why not.
- A runnable block is ``bash`` or ``python``. The test starts one redis-server of its own on
  127.0.0.1 (TCP, append-only file with ``appendfsync everysec``: the single server that
  ``airlock-redis doctor`` passes with exit 0, as docs/operating.md says).
- Before the blocks of a page run, the database is emptied; the blocks of one page then run in the
  order they appear, so a block may use what an earlier block of the same page left (a page leaves a
  call in doubt, then resolves it).
- ``redis://localhost:6379/0`` in a block is replaced by the test server's URL, which
  ``$AIRLOCK_REDIS_URL`` holds too (the default of the operator commands).
  ``$AIRLOCK_SIGNING_KEY`` and ``$AIRLOCK_OLD_SIGNING_KEY`` hold two test keys.
- A ``bash`` block runs with ``bash -e -o pipefail`` in a temporary folder, with this Python's
  ``bin/`` (the venv) first on ``PATH``; a ``python`` block runs as a script of this Python in a
  temporary folder. Each has :data:`BLOCK_TIMEOUT` seconds; its process group is killed after that.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from airlock_redis.embedded import EmbeddedRedis
from tests.conftest import require_redis_server
from tests.procs import PROJECT_ROOT, child_env

BLOCK_TIMEOUT = 120.0
PLACEHOLDER_URL = "redis://localhost:6379/0"
RUNNABLE = "<!-- runnable -->"
NOT_RUN = re.compile(r"<!-- not-run: (?P<why>.*\S.*?) -->")
LANGUAGES = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python", "py": "python"}
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
HEADING = re.compile(r"^(#{1,6})\s+(?P<title>.+?)\s*#*\s*$")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
SIGNING_KEYS = {
    "AIRLOCK_SIGNING_KEY": "docs-test-signing-key-new-0123456789",
    "AIRLOCK_OLD_SIGNING_KEY": "docs-test-signing-key-old-0123456789",
}


def pages() -> list[Path]:
    return [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def page_id(page: Path) -> str:
    return page.relative_to(PROJECT_ROOT).as_posix() if page.is_relative_to(PROJECT_ROOT) else page.name


@dataclass(frozen=True)
class Block:
    """One fenced block: where it starts (1-based line of the opening fence), its language, its
    marker line (``None`` without one) and its text, dedented to the fence's indent."""

    page: str
    line: int
    language: str
    marker: str | None
    text: str

    @property
    def runnable(self) -> bool:
        return self.marker == RUNNABLE

    def where(self) -> str:
        return f"{self.page}:{self.line}"


def strip_indent(line: str, indent: int) -> str:
    """A line of a block without the indent of its opening fence (a block inside a list item)."""
    leading = len(line) - len(line.lstrip(" "))
    return line[min(indent, leading) :]


def parse_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks of a Markdown text. A block closes at a fence of the same character that is
    at least as long and has nothing after it; an unclosed block runs to the end of the text."""
    lines = text.splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        language = opening["info"].strip().split(" ")[0].lower() if opening["info"].strip() else ""
        previous = lines[index - 1].strip() if index > 0 else ""
        marker = previous if previous == RUNNABLE or NOT_RUN.fullmatch(previous) else None
        end = index + 1
        while end < len(lines):
            closing = FENCE.match(lines[end])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            end += 1
        body = "\n".join(strip_indent(line, indent) for line in lines[index + 1 : end])
        blocks.append(Block(page, index + 1, language, marker, body + "\n"))
        index = end + 1
    return blocks


def marking_problems(blocks: list[Block]) -> list[str]:
    """What is wrong with the markers: a block without one, or a runnable one in a language the test
    cannot run."""
    problems = []
    for block in blocks:
        if block.marker is None:
            problems.append(
                f"{block.where()}: a ```{block.language} block without a marker: put {RUNNABLE} "
                "or <!-- not-run: why --> on the line before it"
            )
        elif block.runnable and block.language not in LANGUAGES:
            problems.append(
                f"{block.where()}: marked runnable, but the test runs only {sorted(LANGUAGES)} blocks, "
                f"not {block.language or 'a block without a language'!r}"
            )
    return problems


# -- headings and links ---------------------------------------------------------------------------
def prose_lines(text: str) -> Iterator[str]:
    """The lines of a Markdown text outside fenced blocks."""
    fence: str | None = None
    for line in text.splitlines():
        found = FENCE.match(line)
        if fence is None and found is not None:
            fence = found["fence"]
        elif fence is not None and found is not None and found["fence"].startswith(fence[0]):
            if len(found["fence"]) >= len(fence) and not found["info"].strip():
                fence = None
        elif fence is None:
            yield line


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than '-' and '_' dropped,
    spaces turned into hyphens."""
    plain = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return plain.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for line in prose_lines(text):
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading["title"])
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(page: Path) -> list[str]:
    """Relative links of a page whose file is missing, or whose #anchor names no heading there."""
    prose = "\n".join(prose_lines(page.read_text(encoding="utf-8")))
    problems = []
    for found in LINK.finditer(re.sub(r"`[^`]*`", "", prose)):  # a link's text may span lines
        target = found["target"]
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http://, https://, mailto: are not checked (no network here)
        path_part, _, anchor = target.partition("#")
        destination = (page.parent / path_part).resolve() if path_part else page
        where = f"{page_id(page)}: link {target!r}"
        if not destination.exists():
            problems.append(f"{where}: {destination} does not exist")
            continue
        known = anchors(destination.read_text(encoding="utf-8")) if destination.suffix == ".md" else set()
        if anchor and destination.suffix == ".md" and anchor not in known:
            problems.append(f"{where}: no heading with the anchor #{anchor} in {destination.name}")
    return problems


# -- running the blocks ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def docs_server() -> Iterator[EmbeddedRedis]:
    require_redis_server()
    with EmbeddedRedis(
        unix_socket=False, extra_args=["--appendonly", "yes", "--appendfsync", "everysec"]
    ) as server:
        yield server


def block_env(url: str) -> dict[str, str]:
    env = child_env(AIRLOCK_REDIS_URL=url, **SIGNING_KEYS)
    env.pop("AIRLOCK_REDIS_AUDIT_LOG", None)  # resolve would also append to that file
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in (venv_bin, env.get("PATH", "")) if p)
    return env


def run_block(block: Block, url: str, folder: Path) -> None:
    source = block.text.replace(PLACEHOLDER_URL, url)
    if LANGUAGES[block.language] == "bash":
        script = folder / "block.sh"
        script.write_text(source, encoding="utf-8")
        command = ["bash", "-e", "-o", "pipefail", str(script)]
    else:
        script = folder / "block.py"
        script.write_text(source, encoding="utf-8")
        command = [sys.executable, str(script)]
    process = subprocess.Popen(
        command,
        cwd=folder,
        env=block_env(url),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        pytest.fail(
            f"{block.where()}: still running after {BLOCK_TIMEOUT:.0f} s\n--- block\n{source}"
            f"--- stdout\n{out[-2000:]}\n--- stderr\n{err[-2000:]}"
        )
    assert process.returncode == 0, (
        f"{block.where()}: the {block.language} block exited {process.returncode}\n--- block\n{source}"
        f"--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}"
    )


def runnable_pages() -> list[Path]:
    return [page for page in pages() if any(b.runnable for b in parse_blocks(page.read_text("utf-8"), ""))]


@pytest.mark.redis_server
@pytest.mark.parametrize("page", runnable_pages(), ids=page_id)
def test_runnable_blocks_run_as_written(page: Path, docs_server: EmbeddedRedis, tmp_path: Path) -> None:
    blocks = [b for b in parse_blocks(page.read_text("utf-8"), page_id(page)) if b.runnable]
    assert not marking_problems(blocks)
    with docs_server.client() as client:
        client.flushall()
    url = docs_server.url
    for number, block in enumerate(blocks):
        folder = tmp_path / f"block{number}"
        folder.mkdir()
        run_block(block, url, folder)


# -- the rules themselves -------------------------------------------------------------------------
@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_every_block_is_marked(page: Path) -> None:
    blocks = parse_blocks(page.read_text("utf-8"), page_id(page))
    assert marking_problems(blocks) == []


@pytest.mark.parametrize("page", pages(), ids=page_id)
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert link_problems(page) == []


def test_the_readme_shows_runnable_commands_of_each_kind() -> None:
    """The front door's usage example and its commands are among the blocks that run."""
    blocks = parse_blocks((PROJECT_ROOT / "README.md").read_text("utf-8"), "README.md")
    kinds = {LANGUAGES[b.language] for b in blocks if b.runnable}
    assert kinds == {"bash", "python"}


def test_the_marker_check_catches_an_unmarked_or_unrunnable_block() -> None:
    text = textwrap.dedent(
        """\
        <!-- runnable -->
        ```bash
        true
        ```

        ```python
        print("no marker")
        ```

        <!-- runnable -->
        ```sql
        SELECT 1;
        ```

        <!-- not-run: a signature -->
        ````python
        f(*, x)
        ```
        still inside the four-backtick block
        ````

        - a list item
          <!-- runnable -->
          ```python
          print("indented")
          ```
        """
    )
    blocks = parse_blocks(text, "t.md")
    assert [(b.line, b.language, b.runnable) for b in blocks] == [
        (2, "bash", True),
        (6, "python", False),
        (11, "sql", True),
        (16, "python", False),
        (24, "python", True),
    ]
    assert blocks[3].text == "f(*, x)\n```\nstill inside the four-backtick block\n"
    assert blocks[4].text == 'print("indented")\n'
    problems = marking_problems(blocks)
    assert len(problems) == 2
    assert problems[0].startswith("t.md:6: a ```python block without a marker")
    assert problems[1].startswith("t.md:11: marked runnable, but")


def test_anchors_follow_githubs_rule() -> None:
    text = (
        "# Durability: `wait_replicas`\n## Using it with agent_airlock's `@Airlock`\n## Options\n## Options\n"
    )
    text += "```\n# not a heading\n```\n"
    assert anchors(text) == {
        "durability-wait_replicas",
        "using-it-with-agent_airlocks-airlock",
        "options",
        "options-1",
    }


@pytest.mark.redis_server
def test_a_block_runs_against_the_test_server_and_a_failing_one_fails(
    docs_server: EmbeddedRedis, tmp_path: Path
) -> None:
    check = 'import os, redis\nurl = "redis://localhost:6379/0"\n'
    check += 'assert url == os.environ["AIRLOCK_REDIS_URL"] and url.startswith("redis://127.0.0.1:")\n'
    check += "assert redis.Redis.from_url(url).ping()\n"
    (tmp_path / "ok").mkdir()
    run_block(Block("t.md", 1, "python", RUNNABLE, check), docs_server.url, tmp_path / "ok")
    (tmp_path / "bad").mkdir()
    with pytest.raises(AssertionError, match=r"t\.md:2: the bash block exited 1"):
        run_block(
            Block("t.md", 2, "bash", RUNNABLE, "false\necho never\n"), docs_server.url, tmp_path / "bad"
        )


def test_the_link_check_catches_a_missing_page_or_anchor(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## A section\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\nSee [the section](other.md#a-section), [this page](#title) and\n"
        "[a wrapped\nlink](other.md#no-such-section), [gone](missing.md), `[code](not-a-link.md)`,\n"
        "[web](https://example.com/x.md).\n\n```md\n[in a block](nowhere.md)\n```\n",
        encoding="utf-8",
    )
    problems = link_problems(page)
    assert len(problems) == 2, problems
    assert "no heading with the anchor #no-such-section in other.md" in problems[0]
    assert "missing.md" in problems[1] and "does not exist" in problems[1]


# -- the README's python blocks type-check ----------------------------------------------------------
# A runnable python block of the README is what a newcomer copies into a project that runs
# `mypy --strict`: it must pass there too. Blocks that import an optional framework (anything but the
# standard library, redis and airlock_redis) are left out: their types come from another project.
CHECKED_IMPORTS = frozenset({"airlock_redis", "redis"})


def imported_roots(source: str) -> set[str]:
    """The top-level modules a block imports."""
    import ast

    roots: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            roots.add(node.module.split(".")[0])
    return roots


def optional_imports(source: str) -> set[str]:
    return {
        m for m in imported_roots(source) if m not in sys.stdlib_module_names and m not in CHECKED_IMPORTS
    }


def strict_type_errors(block: Block, folder: Path) -> list[str]:
    """``mypy --strict`` (with the project's configuration) on one block: its error lines, empty when
    it passes."""
    from mypy import api

    script = folder / f"{re.sub(r'[^0-9A-Za-z]+', '_', block.page)}_{block.line}.py"
    script.write_text(block.text, encoding="utf-8")
    out, err, status = api.run(
        [
            "--config-file",
            str(PROJECT_ROOT / "pyproject.toml"),
            "--strict",
            "--cache-dir",
            str(folder / ".mypy_cache"),
            "--no-error-summary",
            "--hide-error-context",
            str(script),
        ]
    )
    # "<script>:<n>: error: ..." -> "<page>:<line in the page>: error: ..." (line 1 follows the fence)
    found = re.compile(re.escape(str(script)) + r":(?P<n>\d+):(?P<rest> error: .*)")
    errors = [
        f"{block.page}:{block.line + int(m['n'])}:{m['rest']}"
        for m in map(found.match, out.splitlines())
        if m is not None
    ]
    assert status == (1 if errors else 0), f"mypy did not run: {err or out}"
    return errors


def readme_python_blocks() -> list[Block]:
    blocks = parse_blocks((PROJECT_ROOT / "README.md").read_text("utf-8"), "README.md")
    return [b for b in blocks if b.runnable and LANGUAGES[b.language] == "python"]


@pytest.fixture(scope="module")
def mypy_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy")  # one cache for every block of the module


@pytest.mark.parametrize("block", readme_python_blocks(), ids=Block.where)
def test_the_readmes_python_blocks_pass_mypy_strict(block: Block, mypy_folder: Path) -> None:
    skipped = optional_imports(block.text)
    if skipped:
        pytest.skip(f"{block.where()} imports {', '.join(sorted(skipped))}: an optional framework")
    assert strict_type_errors(block, mypy_folder) == []


def test_the_type_check_catches_an_error_and_skips_frameworks(mypy_folder: Path) -> None:
    good = Block(
        "t.md", 1, "python", RUNNABLE, "from airlock_redis import EffectGuard\nguard = EffectGuard()\n"
    )
    bad = Block("t.md", 5, "python", RUNNABLE, "def f() -> dict:\n    return {}\n")
    assert strict_type_errors(good, mypy_folder) == []
    errors = strict_type_errors(bad, mypy_folder)
    assert len(errors) == 1 and errors[0].startswith("t.md:6: error: Missing type arguments")
    assert optional_imports("import json, redis\nfrom airlock_redis import X\nfrom . import y\n") == set()
    assert optional_imports("import agent_airlock.x\nfrom langchain.tools import t\n") == {
        "agent_airlock",
        "langchain",
    }
    assert any(optional_imports(b.text) for b in readme_python_blocks())  # the agent_airlock example
