"""The docs' reference tables, generated from the code, so they cannot drift from it.

Each table sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers in its page
(:data:`PAGES`):

* ``config-table`` (docs/reference/configuration.md): every setting, from
  :data:`common.core.config.KNOBS`;
* ``redis-keys`` (docs/reference/redis-and-queues.md): the key schema, from the header of
  :mod:`common.store.keys`;
* ``layout`` (docs/reference/layout.md): every room of ``common/`` (its ``__init__``
  docstring) and every module in it (the first line of its docstring), then the entry scripts
  and support folders;
* ``api-reference`` (docs/reference/api.md): every path and method of the control plane's
  OpenAPI document with its scope, parameters, bodies and answers, and every schema
  (:mod:`devtools.api_reference`).

``python -m devtools.readme`` rewrites the pages; ``--check`` exits 1 when one is stale (what
tests/test_docs.py asserts). The module kept its name from when the tables were in README.md.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

from common.core.config import KNOBS
from common.store import keys
from devtools.api_reference import api_reference

REPO_ROOT = Path(__file__).resolve().parent.parent
REFERENCE = REPO_ROOT / "docs" / "reference"
#: Rooms of ``common/`` in the order a URL meets them (lowest floor first).
ROOMS = ("core", "broker", "store", "web", "intake", "jobs", "work", "media", "sink", "ops", "api")
#: Top-level folders beside ``common/`` and what they hold.
SUPPORT = {
    "scrape_fleet/": "the public API your handlers, pipelines and sinks import (`Router`, "
                     "`Page`, `Request`, `DropItem`, `Sink`); semver, CHANGELOG.md",
    "examples/": "three runnable projects: a documentation site, a paged shop with an item "
                 "pipeline, a news site from its sitemap (docs/examples.md)",
    "docs/": "the documentation site (mkdocs.yml); the reference pages are generated",
    "devtools/": "local RabbitMQ and Redis for the tests and the local run, the loopback "
                 "test site, fault injection, the docs' reference generator",
    "bench/": "the benchmark (one module per phase) and its farm of static sites",
    "tests/": "mirrors `common/`: `tests/<room>/` per room, whole-fleet tests at the top",
    "monitoring/": "Prometheus and Grafana provisioning for compose",
    "deploy/": "Kubernetes manifests (kustomize base, local and prod overlays) and the CRD "
               "schemas they are validated against",
    "scripts/": "bootstrap, the local fleet, the test command",
}


def docstring_summary(path: Path) -> str:
    """The first paragraph of a module's docstring, on one line."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def entry_scripts() -> list[Path]:
    return sorted(p for p in REPO_ROOT.glob("*.py"))


def room_modules(room: str) -> list[Path]:
    """A room's modules, then each of its subpackages' (``common/work/steps/``), at any depth."""
    return package_modules(REPO_ROOT / "common" / room)


def package_modules(package: Path) -> list[Path]:
    """The modules of ``package``, then those of its subpackages, each after its ``__init__``
    (listed so that the subpackage's docstring heads its modules)."""
    found = sorted(p for p in package.glob("*.py") if p.name != "__init__.py")
    for sub in sorted(p.parent for p in package.glob("*/__init__.py")):
        found += [sub / "__init__.py", *package_modules(sub)]
    return found


def config_table() -> str:
    """The configuration table, one row per knob; a secret knob's default shows as ``***``
    and a URL knob's through redact_url (:meth:`Knob.show`), as everywhere else."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for knob in KNOBS:
        default = "(unset)" if knob.default is None else f"`{knob.show(knob.default)}`"
        rows.append(f"| `{knob.env}` | {default} | {knob.help} |")
    return "\n".join(rows)


def layout() -> str:
    """The house: entry scripts, then each room of ``common/`` with its modules."""
    lines = ["| Where | What lives there |", "|---|---|"]
    for script in entry_scripts():
        lines.append(f"| `{script.name}` | {docstring_summary(script)} |")
    for room in ROOMS:
        init = REPO_ROOT / "common" / room / "__init__.py"
        lines.append(f"| **`common/{room}/`** | **{docstring_summary(init)}** |")
        for module in room_modules(room):
            where = module.relative_to(REPO_ROOT)
            if module.name == "__init__.py":
                lines.append(f"| *`{where.parent}/`* | *{docstring_summary(module)}* |")
            else:
                lines.append(f"| `{where}` | {docstring_summary(module)} |")
    for folder, what in SUPPORT.items():
        lines.append(f"| `{folder}` | {what} |")
    return "\n".join(lines)


def redis_keys() -> str:
    """The key schema from :mod:`common.store.keys`'s header, one row per key."""
    entries: list[list[str]] = []
    for line in (keys.__doc__ or "").splitlines():
        match = re.match(r"^    (\S+)\s{2,}(.*)$", line)
        if match:
            entries.append([match.group(1), match.group(2).strip()])
        elif entries and line.startswith("      ") and line.strip():
            entries[-1][1] += " " + line.strip()
    rows = ["| Key | Holds |", "|---|---|"]
    rows += [f"| `{key}` | {holds} |" for key, holds in entries]
    return "\n".join(rows)


SECTIONS: dict[str, Callable[[], str]] = {
    "config-table": config_table, "layout": layout, "redis-keys": redis_keys,
    "api-reference": api_reference}
#: Each generated page and the sections it holds.
PAGES: dict[Path, tuple[str, ...]] = {
    REFERENCE / "configuration.md": ("config-table",),
    REFERENCE / "redis-and-queues.md": ("redis-keys",),
    REFERENCE / "layout.md": ("layout",),
    REFERENCE / "api.md": ("api-reference",),
}


def section(text: str, name: str) -> str | None:
    """What stands between ``name``'s markers in ``text`` (None when they are missing)."""
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n?<!-- {name}:end -->", text, re.S)
    return found.group(1) if found else None


def render(text: str, names: tuple[str, ...] = tuple(SECTIONS)) -> str:
    """``text`` with the generated sections ``names`` rewritten."""
    for name in names:
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        pattern = re.compile(rf"{re.escape(start)}\n.*?{re.escape(end)}", re.S)
        if not pattern.search(text):
            raise ValueError(f"the page lost its {name} markers")
        block = f"{start}\n{SECTIONS[name]()}\n{end}"
        text = pattern.sub(lambda _m, block=block: block, text)
    return text


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.readme",
        description="Rewrite the docs' generated reference tables (docs/reference/).")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a page is stale")
    args = parser.parse_args(argv)
    stale = []
    for page, names in PAGES.items():
        text = page.read_text(encoding="utf-8")
        updated = render(text, names)
        if updated == text:
            continue
        stale.append(page.relative_to(REPO_ROOT))
        if not args.check:
            page.write_text(updated, encoding="utf-8")
    if args.check and stale:
        print(f"stale: {', '.join(map(str, stale))}: python -m devtools.readme", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
