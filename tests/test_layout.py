"""The house rules: rooms of common/ import only lower floors, modules stay small, no cycles."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from devtools import readme

REPO = Path(__file__).resolve().parent.parent
COMMON = REPO / "common"
#: Each room and the rooms it may import (what its __init__ docstring says).
MAY_IMPORT = {
    "core": set(),
    "broker": {"core"},
    "store": {"core"},
    "web": {"core", "store"},
    "intake": {"core", "broker", "store", "web"},
    "work": {"core", "broker", "store", "web", "intake"},
    "sink": {"core", "store"},
    "ops": {"core", "broker", "store", "web", "intake", "work", "sink"},
}
MAX_MODULE_LINES = 350
MAX_ENTRY_SCRIPT_LINES = 120


def _modules() -> list[Path]:
    return sorted(COMMON.glob("**/*.py"))


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every ``common...`` module ``path`` imports (``from common.x import y`` gives both
    ``common.x`` and ``common.x.y``; the one that is a module counts)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("common"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("common"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    known = {_dotted(p) for p in _modules()}
    return {name for name in found if name in known}


def _room(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 else None


def test_common_has_exactly_the_rooms_the_readme_names():
    rooms = {p.name for p in COMMON.iterdir() if (p / "__init__.py").exists()}
    assert rooms == set(MAY_IMPORT) == set(readme.ROOMS)
    assert not [p.name for p in COMMON.glob("*.py") if p.name != "__init__.py"], (
        "every module of common/ lives in a room")


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_a_room_imports_only_the_rooms_below_it(room):
    allowed = MAY_IMPORT[room] | {room}
    wrong = []
    for path in sorted((COMMON / room).glob("*.py")):
        for name in _imports(path):
            if _room(name) not in allowed:
                wrong.append(f"{path.relative_to(REPO)} imports {name}")
    assert not wrong, wrong


@pytest.mark.parametrize("room", sorted(MAY_IMPORT))
def test_each_room_says_what_lives_there_and_what_it_may_import(room):
    doc = ast.get_docstring(ast.parse((COMMON / room / "__init__.py").read_text()))
    assert doc and "May import:" in doc
    for other in MAY_IMPORT[room]:
        assert f"common.{other}" in doc or "every room" in doc


def test_no_module_in_common_is_over_350_lines():
    long = {str(p.relative_to(REPO)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, long


def test_no_entry_script_is_over_120_lines():
    long = {p.name: n for p in REPO.glob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_ENTRY_SCRIPT_LINES}
    assert not long, long


def test_no_module_of_common_imports_itself_in_a_circle():
    graph = {_dotted(p): _imports(p) for p in _modules()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                raise AssertionError(" -> ".join([*path, node, nxt]))
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_every_module_has_a_docstring():
    missing = [str(p.relative_to(REPO)) for p in [*_modules(), *REPO.glob("*.py")]
               if not ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))]
    assert not missing, missing
