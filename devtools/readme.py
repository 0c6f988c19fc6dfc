"""README sections generated from the code, so they cannot drift from it.

Each section sits between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` markers:

* ``config-table``: every setting, from :data:`common.core.config.KNOBS`;
* ``layout``: every room of ``common/`` (its ``__init__`` docstring) and every module in it
  (the first line of its docstring), then the entry scripts and support folders;
* ``redis-keys``: the key schema, from the header of :mod:`common.store.keys`.

``python -m devtools.readme`` rewrites README.md; ``--check`` exits 1 when it is stale (what
tests/test_docs.py asserts).
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from common.core.config import KNOBS
from common.store import keys

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
#: Rooms of ``common/`` in the order a URL meets them (lowest floor first).
ROOMS = ("core", "broker", "store", "web", "intake", "work", "sink", "ops")
#: Top-level folders beside ``common/`` and what they hold.
SUPPORT = {
    "devtools/": "local RabbitMQ and Redis for the tests and the local run, the loopback "
                 "test site, fault injection, this README generator",
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
    return sorted(p for p in (REPO_ROOT / "common" / room).glob("*.py")
                  if p.name != "__init__.py")


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
            lines.append(f"| `common/{room}/{module.name}` | {docstring_summary(module)} |")
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


SECTIONS = {"config-table": config_table, "layout": layout, "redis-keys": redis_keys}


def render(text: str) -> str:
    """``text`` with every generated section rewritten."""
    for name, build in SECTIONS.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        pattern = re.compile(rf"{re.escape(start)}\n.*?{re.escape(end)}", re.S)
        if not pattern.search(text):
            raise ValueError(f"README lost its {name} markers")
        section = f"{start}\n{build()}\n{end}"
        text = pattern.sub(lambda _m, section=section: section, text)
    return text


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    updated = render(text)
    if "--check" in argv:
        if updated != text:
            print("README.md is stale: python -m devtools.readme", file=sys.stderr)
            return 1
        return 0
    README.write_text(updated, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
