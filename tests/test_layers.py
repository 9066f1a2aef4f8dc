"""The layers of the package: each module imports only modules of its own layer or the ones below,
the pure core imports nothing outside the core (and does no logging), and only the package face
imports the package face."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "airlock_redis"

# the first name below the package -> its layer (lower imports nothing higher)
LAYERS = {
    "core": 0,
    "_version": 0,
    "context": 0,
    "redaction": 0,
    "stores": 1,
    "approval": 1,
    "observability": 1,
    "embedded": 1,
    "lease": 1,
    "probing": 1,
    "executors": 2,
    "reporting": 2,
    "operator": 2,
    "guard": 3,
    "effect_guard": 3,
    "airlock": 4,
    "airlock_state": 4,
    "airlock_policy": 4,
    "airlock_approval": 4,
    "airlock_audit": 4,
    "airlock_calls": 4,
    "integrations": 4,
    "loadgen": 4,
    "cli": 4,
    "__main__": 4,
    "__init__": 5,
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _name(path: Path) -> list[str]:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    return parts


def _imported(path: Path) -> set[tuple[str, ...]]:
    """What the module imports from the package, as name parts below ``airlock_redis`` (empty: the face)."""
    here = _name(path)
    package = here[:-1]  # the package the module is in (for __init__, itself)
    found: set[tuple[str, ...]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                target = [*base, *(node.module.split(".") if node.module else [])]
                if node.module is None:  # from . import x: x is a module (or a name of the face)
                    for alias in node.names:
                        found.add((*target, alias.name) if target else ())
                    continue
                found.add(tuple(target))
            elif node.module and node.module.split(".")[0] == "airlock_redis":
                found.add(tuple(node.module.split(".")[1:]))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "airlock_redis":
                    found.add(tuple(alias.name.split(".")[1:]))
    return found


def _layer(parts: list[str] | tuple[str, ...]) -> int:
    return LAYERS[parts[0]] if parts else LAYERS["__init__"]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_nothing_from_a_layer_above_its_own(path: Path) -> None:
    here = _name(path)
    mine = _layer(here)
    for target in _imported(path):
        if path.name == "__init__.py" and len(here) == 1:
            continue  # the face imports everything (and loads the agent_airlock adapter lazily)
        assert target, f"{'/'.join(here)} imports the package face"
        assert _layer(target) <= mine, f"{'/'.join(here)} (layer {mine}) imports {'.'.join(target)}"
        if here[0] == "core":
            assert target[0] == "core", f"the pure core module {'/'.join(here)} imports {'.'.join(target)}"


def test_every_module_has_a_layer() -> None:
    missing = sorted({_name(p)[0] for p in _modules()} - LAYERS.keys())
    assert not missing, f"give these a layer in LAYERS: {missing}"


@pytest.mark.parametrize("path", sorted((PACKAGE / "core").glob("*.py")), ids=lambda p: p.name)
def test_the_core_does_no_logging_and_opens_no_connection(path: Path) -> None:
    tree = ast.parse(path.read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        node.module.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
    }
    assert not imported & {"logging", "socket", "redis", "asyncio", "threading"} - _ALLOWED.get(
        path.name, set()
    )


# the refusal texts name the thread the call runs in (a read, not I/O)
_ALLOWED = {"refusals.py": {"threading"}}


def _imports_redis(tree: ast.Module) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "redis" for a in node.names):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and (node.module or "").split(".")[0] == "redis"
        ):
            return True
    return False


def _private_reads(tree: ast.Module) -> list[str]:
    """``x._name`` where ``x`` is not ``self``/``cls``: a private attribute of something else."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and not (isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"})
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_that_uses_redis_py_reads_no_private_attribute(path: Path) -> None:
    """redis-py's public API only: its private attributes change between releases without notice."""
    tree = ast.parse(path.read_text())
    if _imports_redis(tree):
        assert _private_reads(tree) == []
