"""The package face and the layers under it (issue 24): the version lives in ``_version.py`` and no
module imports the face for it; ``EffectRefused`` is an abstract base whose subclasses print,
copy and pickle; the two demo modules share ``demo_common`` instead of importing each other; and
``airlock_redis.__all__`` is what tool authors and operators use, as the package docstring lists it,
with the store-implementer types in ``airlock_redis.stores``."""

from __future__ import annotations

import ast
import copy
import pickle
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import airlock_redis
import airlock_redis.stores
import airlock_redis.stores.operator_view as operator_view_module
from airlock_redis import _version
from airlock_redis.core import errors
from airlock_redis.core import records as core_records
from airlock_redis.stores import base as store_base

PROJECT_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = PROJECT_ROOT / "airlock_redis"

# What tool authors and operators use: the package docstring lists the same names, by use.
PUBLIC_NAMES = frozenset(
    {
        # guarding tools
        "EffectGuard",
        "RedisEffectStore",
        "InMemoryEffectStore",
        "EffectStore",
        "tool_call_context",
        "CallContext",
        "current_call_context",
        "current_idempotency_key",
        "reversibility",
        "reversibility_of",
        "Reversibility",
        "reconcile_with",
        "ProbeCall",
        "TookEffect",
        "NeverTookEffect",
        "GuardedCall",
        "Execution",
        "Airlock",
        "SecurityPolicy",
        "Approver",
        "ApprovalRequest",
        # errors that leave a call in doubt
        "DEFAULT_AMBIGUOUS_ERRORS",
        "AmbiguityRule",
        "Settlement",
        "EffectOutcomeUnknown",
        "is_ambiguous",
        "explain",
        # refusals
        "EffectRefused",
        "EffectStatusUnknown",
        "EffectPolicyViolation",
        "ToolCallIdRequired",
        "TargetArgsRequired",
        "ApprovalDenied",
        "StoreUnavailable",
        "ResultNotStored",
        "RecordCorrupt",
        "EffectInProgress",
        "REFUSAL_REASONS",
        "RefusalReason",
        # other errors
        "StoreError",
        "InvalidToolCallId",
        "CanonicalizationError",
        # operating
        "Record",
        "Status",
        "TransitionResult",
        "idempotency_key",
        "canonical_arguments",
        "__version__",
    }
)
# Only someone writing a store needs these: in airlock_redis.stores, not in the face.
# the operator's protocol and its types (stores/operator_view.py)
OPERATOR_NAMES = frozenset({"ListFilter", "ListPage", "ListQuery", "OperatorStore", "RecordView", "views_of"})
STORE_ONLY_NAMES = (
    frozenset({"BeginKind", "BeginOutcome", "BeginRequest", "DurableEffectStore", "RemoteEffectStore"})
    | OPERATOR_NAMES
)

REFUSALS: list[type[errors.EffectRefused]] = sorted(
    (
        value
        for value in vars(errors).values()
        if isinstance(value, type)
        and issubclass(value, errors.EffectRefused)
        and value is not errors.EffectRefused
    ),
    key=lambda cls: cls.__name__,
)


# -- the version ---------------------------------------------------------------------------------
def _pyproject_version() -> str:
    text = (PROJECT_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version\s*=\s*"([^"]+)"\s*$', project, re.M)
    assert found is not None, "pyproject.toml declares no static [project] version"
    return found.group(1)


def test_the_version_lives_in_its_own_module_and_agrees_with_pyproject() -> None:
    assert airlock_redis.__version__ is _version.__version__
    assert _version.__version__ == _pyproject_version()


def _face_imports(source: str, path: Path) -> list[str]:
    """The imports in ``source``, the text of the module at ``path`` (under airlock_redis/), at any
    depth (lazy ones too), that take a name from the package face, ``airlock_redis/__init__.py``,
    rather than a module of the package."""
    modules = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    depth = len(path.relative_to(PACKAGE).parts) - 1  # 0 for airlock_redis/x.py
    if path.name == "__init__.py":
        depth -= 1
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name == "airlock_redis"]
        elif isinstance(node, ast.ImportFrom):
            from_face = (node.level == 0 and node.module == "airlock_redis") or (
                node.level == depth + 1 and node.module is None
            )
            if from_face:
                found += [
                    f"line {node.lineno}: from the face import {a.name}"
                    for a in node.names
                    if a.name not in modules
                ]
    return found


def test_no_module_imports_the_package_face() -> None:
    """Lower layers never import upward, not even the face for the version string (observability
    did, for its meter's version). Importing any submodule runs the face first, so a check of
    ``sys.modules`` cannot see this: the imports are read from the source."""
    offenders = {
        str(path.relative_to(PROJECT_ROOT)): imports
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "__init__.py"
        and (imports := _face_imports(path.read_text(encoding="utf-8"), path))
    }
    assert offenders == {}


def test_the_face_import_check_sees_each_spelling() -> None:
    """What observability did (a lazy ``from . import __version__``) is seen from any depth; an import
    of a module of the package is not taken for one of the face."""
    lazy = "def f():\n    from . import __version__\n    from . import observability\n"
    assert _face_imports(lazy, PACKAGE / "observability.py") == ["line 2: from the face import __version__"]
    deeper = lazy.replace("from .", "from ..")
    assert _face_imports(deeper, PACKAGE / "cli" / "x.py") == ["line 2: from the face import __version__"]
    assert _face_imports(lazy, PACKAGE / "cli" / "x.py") == []  # cli's own package, not the face
    absolute = "from airlock_redis import EffectGuard, stores\nimport airlock_redis\n"
    assert _face_imports(absolute, PACKAGE / "stores" / "__init__.py") == [
        "line 1: from the face import EffectGuard",
        "line 2: import airlock_redis",
    ]


def test_observability_gives_the_meter_the_package_version() -> None:
    from airlock_redis import observability

    assert vars(observability)["__version__"] == airlock_redis.__version__
    source = (PACKAGE / "observability.py").read_text(encoding="utf-8")
    assert "from ._version import __version__" in source


# -- EffectRefused -------------------------------------------------------------------------------
def test_every_reason_has_one_refusal_class() -> None:
    assert sorted(cls.reason for cls in REFUSALS) == sorted(errors.REFUSAL_REASONS)
    assert all(getattr(airlock_redis, cls.__name__) is cls for cls in REFUSALS)


def test_the_base_refusal_cannot_be_raised() -> None:
    with pytest.raises(TypeError) as raised:
        errors.EffectRefused("m", tool="charge", tool_call_id="call_1")
    text = str(raised.value)
    assert "EffectRefused has no reason, so it cannot be raised" in text
    assert all(cls.__name__ in text for cls in REFUSALS), text

    class NoReason(errors.EffectRefused):
        pass

    class MadeUp(errors.EffectRefused):
        reason = "made_up"  # type: ignore[assignment]

    with pytest.raises(TypeError, match="NoReason has no reason"):
        NoReason("m", tool="charge", tool_call_id="call_1")
    with pytest.raises(TypeError, match="MadeUp has reason 'made_up', which is not a refusal reason"):
        MadeUp("m", tool="charge", tool_call_id="call_1")

    class Narrower(errors.EffectStatusUnknown):
        """A subclass that keeps its parent's reason can be raised."""

    assert str(Narrower("m", tool="charge", tool_call_id="call_1")) == "[effect_status_unknown] m"


FIELDS = ("reason", "message", "tool", "tool_call_id", "idempotency_key", "fix_hint", "model_message")


def _looks(error: errors.EffectRefused) -> tuple[Any, ...]:
    return (type(error), str(error), repr(error), error.args, *(getattr(error, f) for f in FIELDS))


@pytest.mark.parametrize("cls", REFUSALS, ids=lambda cls: cls.__name__)
@pytest.mark.parametrize(
    "options",
    [
        {"tool_call_id": "call_1", "idempotency_key": "k" * 64, "fix_hint": "Run airlock-redis resolve."},
        {"tool_call_id": None},
    ],
    ids=["full", "bare"],
)
def test_a_refusal_prints_copies_and_pickles(
    cls: type[errors.EffectRefused], options: dict[str, Any]
) -> None:
    refused = cls("the operator text", tool="charge", **options)
    hint = options.get("fix_hint")
    assert str(refused) == f"[{cls.reason}] the operator text" + (f" {hint}" if hint else "")
    assert repr(refused) == (
        f"{cls.__name__}(reason={cls.reason!r}, tool='charge', "
        f"tool_call_id={options['tool_call_id']!r}, message='the operator text')"
    )
    refused.add_note("seen by the host")  # state beyond the constructor's arguments comes along too
    copies = [copy.copy(refused), copy.deepcopy(refused)]
    copies += [
        pickle.loads(pickle.dumps(refused, protocol)) for protocol in range(pickle.HIGHEST_PROTOCOL + 1)
    ]
    for again in copies:
        assert again is not refused
        assert _looks(again) == _looks(refused)
        assert again.__notes__ == ["seen by the host"]
        assert "reason" not in vars(again)  # still the class's attribute


def test_a_refusal_pickles_through_a_raise_in_another_process() -> None:
    """What a worker process hands its parent: the parent unpickles it and raises the same refusal."""
    code = (
        "import pickle, sys\n"
        "from airlock_redis import StoreUnavailable\n"
        "e = StoreUnavailable('down', tool='charge', tool_call_id='call_7', idempotency_key='k',\n"
        "                     fix_hint='h')\n"
        "sys.stdout.buffer.write(pickle.dumps(e))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=120, check=True, cwd=PROJECT_ROOT
    )
    again = pickle.loads(done.stdout)
    assert isinstance(again, airlock_redis.StoreUnavailable)
    assert (again.tool_call_id, again.idempotency_key, str(again)) == (
        "call_7",
        "k",
        "[store_unavailable] down h",
    )


# -- the demo modules ----------------------------------------------------------------------------
def _imports(path: Path, *, module_level_only: bool) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = list(tree.body) if module_level_only else list(ast.walk(tree))
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` blocks count as module level
            nodes += node.body
        elif isinstance(node, ast.ImportFrom):
            prefix = "." * node.level + (node.module or "")
            names.add(prefix)
            names.update(f"{prefix}.{a.name}" if node.module else f"{prefix}{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_demo_frameworks_does_not_import_demo_cmd() -> None:
    cli = PACKAGE / "cli"
    frameworks = _imports(cli / "demo_frameworks.py", module_level_only=False)
    assert not {name for name in frameworks if "demo_cmd" in name}, frameworks
    assert ".demo_common" in frameworks
    at_load = _imports(cli / "demo_cmd.py", module_level_only=True)
    assert not {name for name in at_load if "demo_frameworks" in name}, at_load  # only lazily, in run()
    assert ".demo_frameworks" in _imports(cli / "demo_cmd.py", module_level_only=False)
    common = _imports(cli / "demo_common.py", module_level_only=False)
    assert not {name for name in common if "demo_cmd" in name or "demo_frameworks" in name}, common


def test_each_demo_module_loads_without_the_other() -> None:
    code = (
        "import sys, importlib\n"
        "importlib.import_module(sys.argv[1])\n"
        "print(sorted(m for m in sys.modules if m.startswith('airlock_redis.cli.demo')))\n"
    )
    for module, other in (("demo_frameworks", "demo_cmd"), ("demo_cmd", "demo_frameworks")):
        done = subprocess.run(
            [sys.executable, "-c", code, f"airlock_redis.cli.{module}"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=PROJECT_ROOT,
        )
        loaded = ast.literal_eval(done.stdout.strip())
        assert f"airlock_redis.cli.{module}" in loaded and f"airlock_redis.cli.{other}" not in loaded, loaded


# -- __all__ -------------------------------------------------------------------------------------
def _documented_names() -> set[str]:
    """The names the package docstring lists under "Public names (``__all__``)"."""
    doc = airlock_redis.__doc__ or ""
    section = doc.split("Public names (``__all__``)", 1)[1].split("Writing a store of your own", 1)[0]
    return set(re.findall(r"``([A-Za-z_][A-Za-z0-9_]*)``", section)) - {"__all__"}


def test_all_is_what_tool_authors_and_operators_use() -> None:
    assert len(airlock_redis.__all__) == len(set(airlock_redis.__all__))
    assert set(airlock_redis.__all__) == PUBLIC_NAMES
    assert _documented_names() == PUBLIC_NAMES


def test_the_store_implementer_types_live_in_stores() -> None:
    assert not STORE_ONLY_NAMES & set(airlock_redis.__all__)
    for name in STORE_ONLY_NAMES:  # a clean break: not importable from the face either
        assert not hasattr(airlock_redis, name), name
    assert set(airlock_redis.stores.__all__) == STORE_ONLY_NAMES | {
        "EffectStore",
        "Record",
        "Settlement",
        "Status",
        "TransitionResult",
    }
    for name in airlock_redis.stores.__all__:
        homes = (vars(core_records), vars(store_base), vars(operator_view_module))
        defined = next(home[name] for home in homes if name in home)
        assert getattr(airlock_redis.stores, name) is defined, name
        if name in PUBLIC_NAMES:
            assert getattr(airlock_redis, name) is defined, name
        role = ":func:" if name == "views_of" else ":class:"
        if name in OPERATOR_NAMES - {"OperatorStore", "views_of"}:
            continue  # the protocol's own types: documented on OperatorStore
        assert f"{role}`{name}`" in (airlock_redis.stores.__doc__ or ""), name


def _doc_imports() -> list[tuple[str, str, str]]:
    """(page, module, name) for each ``from airlock_redis... import ...`` in README.md and docs/."""
    found = []
    for page in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        text = page.read_text(encoding="utf-8")
        for module, names in re.findall(r"^\s*from (airlock_redis[\w.]*) import \(?([^)\n]+)", text, re.M):
            for spelled in names.split(","):
                name = spelled.split(" as ")[0].strip()
                if name:
                    found.append((page.name, module, name))
    return found


def test_every_name_the_docs_import_is_there() -> None:
    imports = _doc_imports()
    assert ("README.md", "airlock_redis", "EffectGuard") in imports
    missing = []
    for page, module, name in imports:
        if name in ("Airlock", "SecurityPolicy"):
            continue  # the airlock extra: checked by tests/test_airlock_import.py
        try:
            loaded = __import__(module, fromlist=[name])
        except ImportError as error:
            missing.append(f"{page}: {module} ({error})")
            continue
        if not hasattr(loaded, name):
            missing.append(f"{page}: from {module} import {name}")
    assert missing == []
