"""The house rules: rooms of common/ import only lower floors, modules stay small, no cycles;
the worker's steps are one independent module each, run in STEPS order; the public package
imports only the engine's core."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from devtools import readme

REPO = Path(__file__).resolve().parent.parent
COMMON = REPO / "common"
STEPS_DIR = COMMON / "work" / "steps"
PUBLIC = REPO / "scrape_fleet"
#: The public package's one module that imports the engine: its test helper builds a page as
#: the worker does (scrape_fleet/testing.py); nothing of common/ may import it back.
PUBLIC_TEST_HELPER = "scrape_fleet.testing"
#: Each room and the rooms it may import (what its __init__ docstring says).
MAY_IMPORT = {
    "core": set(),
    "broker": {"core"},
    "store": {"core"},
    "web": {"core", "store"},
    "intake": {"core", "broker", "store", "web"},
    "jobs": {"core", "broker", "store", "web", "intake"},
    "work": {"core", "broker", "store", "web", "intake", "jobs"},
    "media": {"core", "broker", "store", "web", "intake", "jobs", "work"},
    "sink": {"core", "store"},
    "ops": {"core", "broker", "store", "web", "intake", "jobs", "work", "media", "sink"},
    "api": {"core", "broker", "store", "web", "intake", "jobs", "work", "media", "sink", "ops"},
}
MAX_MODULE_LINES = 350
MAX_ENTRY_SCRIPT_LINES = 120


def _modules() -> list[Path]:
    return sorted(COMMON.glob("**/*.py"))


def _dotted(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imported_names(path: Path, package: str = "common") -> set[str]:
    """Every dotted name under ``package`` that ``path`` imports (``from common.x import y``
    gives both ``common.x`` and ``common.x.y``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == package)
        elif (isinstance(node, ast.ImportFrom) and node.module
              and node.module.split(".")[0] == package):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _imports(path: Path) -> set[str]:
    """Every ``common...`` module ``path`` imports (of ``common.x`` and ``common.x.y``, the
    one that is a module counts)."""
    known = {_dotted(p) for p in _modules()}
    return {name for name in _imported_names(path) if name in known}


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
    for path in sorted((COMMON / room).rglob("*.py")):  # subpackages too (work/steps/)
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


def _steps() -> list[tuple[str, str]]:
    """STEPS of common/work/steps/__init__.py as (module, class) pairs, in order, read from
    the package's own imports."""
    tree = ast.parse((STEPS_DIR / "__init__.py").read_text(encoding="utf-8"))
    module_of = {alias.asname or alias.name: node.module.rsplit(".", 1)[1]
                 for node in tree.body if isinstance(node, ast.ImportFrom)
                 and (node.module or "").startswith("common.work.steps.")
                 for alias in node.names}
    [steps] = [node.value for node in tree.body if isinstance(node, ast.Assign)
               and [getattr(t, "id", None) for t in node.targets] == ["STEPS"]]
    return [(module_of[name.id], name.id) for name in steps.elts]


def _step_call(module: str, name: str) -> str:
    """The name of step ``name``'s one call: its public method taking the trip."""
    tree = ast.parse((STEPS_DIR / f"{module}.py").read_text(encoding="utf-8"))
    [cls] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    calls = [f.name for f in cls.body if isinstance(f, ast.FunctionDef)
             and not f.name.startswith("_") and [a.arg for a in f.args.args] == ["self", "trip"]]
    assert len(calls) == 1, f"{module}.{name} has one call taking the trip, not {calls}"
    return calls[0]


def test_the_steps_are_listed_run_and_declared_in_one_order():
    steps = _steps()
    doc = ast.get_docstring(ast.parse((STEPS_DIR / "__init__.py").read_text(encoding="utf-8")))
    listed = re.search(r"(\w+(?:\s*→\s*\w+)+)", doc).group(1)
    assert [m.strip() for m in listed.split("→")] == [module for module, _ in steps], (
        "the package docstring lists the step modules in STEPS order")
    wanted = [_step_call(module, name) for module, name in steps]
    tree = ast.parse((COMMON / "work" / "processor.py").read_text(encoding="utf-8"))
    [process] = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 and f.name == "process"]
    called = sorted((node.lineno, node.col_offset, node.func.attr)
                    for node in ast.walk(process) if isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute) and node.func.attr in wanted)
    assert [name for *_, name in called] == wanted, "Processor.process runs STEPS in order"
    on_disk = {p.stem for p in STEPS_DIR.glob("*.py")} - {"__init__", "trip"}
    assert on_disk == {module for module, _ in steps}, "every step module is in STEPS"


def test_no_step_imports_another_step():
    steps = {f"common.work.steps.{module}" for module, _ in _steps()}
    wrong = [f"{module} imports {name}" for module in sorted(steps)
             for name in _imports(STEPS_DIR / f"{module.rsplit('.', 1)[1]}.py")
             if name in steps or name == "common.work.steps"]
    assert not wrong, wrong


def test_the_public_package_imports_only_the_engines_core():
    wrong = [f"{path.relative_to(REPO)} imports {name}"
             for path in sorted(PUBLIC.rglob("*.py")) if _dotted(path) != PUBLIC_TEST_HELPER
             for name in _imported_names(path)
             if name != "common.core" and not name.startswith("common.core.")]
    assert not wrong, wrong
    back = [f"{path.relative_to(REPO)} imports {PUBLIC_TEST_HELPER}" for path in _modules()
            if PUBLIC_TEST_HELPER in _imported_names(path, "scrape_fleet")]
    assert not back, back
