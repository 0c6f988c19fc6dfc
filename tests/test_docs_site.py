"""The docs site builds with warnings as errors, and the docs' Python examples run.

``mkdocs build --strict`` with mkdocs.yml's ``validation`` settings turns a link to a missing
page, a missing anchor or a page left out of the nav into a failed build (shown below on a
broken copy). Every ```python block of README.md and of every page under docs/ (the pages other
sessions own included, as soon as they exist) runs in a subprocess of its own, from a temporary
directory, with the repository on PYTHONPATH. A block that cannot run on its own (it needs a
running fleet, say) is preceded by ``<!-- no-run: the reason -->``; nothing is skipped
silently: the reason must be given and the skipped blocks are counted. The shell blocks of the
same pages are checked by tests/test_readme_commands.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

MKDOCS_YML = REPO_ROOT / "mkdocs.yml"
PAGES = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md")))
NO_RUN = re.compile(r"^\s*<!--\s*no-run:(.*?)-->\s*$")
FENCE = re.compile(r"^(\s*)```(\w*)")
#: A block runs this long at most.
BLOCK_TIMEOUT_S = 60


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    no_run: str | None  # the reason given, "" when the marker has none; None: runs


def python_blocks(path: Path) -> list[Block]:
    """The ```python (or ```py) blocks of a page, dedented, each with its no-run reason."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    page = str(path.relative_to(REPO_ROOT))
    n = 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if not fence:
            n += 1
            continue
        indent, language = fence.groups()
        start, body = n, []
        n += 1
        while n < len(lines) and not lines[n].strip().startswith("```"):
            body.append(lines[n])
            n += 1
        n += 1
        if language not in {"python", "py"}:
            continue
        before = [line for line in lines[:start] if line.strip()]
        marker = NO_RUN.match(before[-1]) if before else None
        code = textwrap.dedent("\n".join(line[len(indent):] if line.startswith(indent) else line
                                         for line in body))
        blocks.append(Block(page, start + 1, code + "\n",
                            marker.group(1).strip() if marker else None))
    return blocks


BLOCKS = [block for page in PAGES for block in python_blocks(page)]


def _mkdocs_build(config: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config),
                           "-d", str(site)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path):
    result = _mkdocs_build(MKDOCS_YML, tmp_path / "site", REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WARNING" not in result.stderr, result.stderr[-3000:]
    for page in (REPO_ROOT / "docs").rglob("*.md"):
        relative = page.relative_to(REPO_ROOT / "docs").with_suffix("")
        folder = relative.parent if relative.name == "index" else relative
        assert (tmp_path / "site" / folder / "index.html").is_file(), f"{page} was not built"
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text(encoding="utf-8")
    assert "semantic versioning" in changelog, "CHANGELOG.md is not included in the changelog"
    concepts = (tmp_path / "site" / "concepts" / "index.html").read_text(encoding="utf-8")
    assert 'class="mermaid"' in concepts, "the journey diagram is not a mermaid block"


def test_a_broken_link_or_a_page_left_out_of_the_nav_fails_the_build(tmp_path: Path):
    shutil.copytree(REPO_ROOT / "docs", tmp_path / "docs")
    shutil.copy(REPO_ROOT / "CHANGELOG.md", tmp_path / "CHANGELOG.md")
    shutil.copy(MKDOCS_YML, tmp_path / "mkdocs.yml")
    with (tmp_path / "docs" / "concepts.md").open("a", encoding="utf-8") as page:
        page.write("\nSee [nowhere](no-such-page.md) and [there](operations.md#no-such-part).\n")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n", encoding="utf-8")
    result = _mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site", tmp_path)
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr
    assert "no-such-part" in result.stderr
    assert "orphan.md" in result.stderr


def test_every_python_block_that_does_not_run_says_why():
    skipped = [block for block in BLOCKS if block.no_run is not None]
    assert [f"{b.page}:{b.line}" for b in skipped if not b.no_run] == [], (
        "a <!-- no-run: --> marker without a reason")
    runnable = [block for block in BLOCKS if block.no_run is None]
    assert len(runnable) >= 3, "the docs lost their runnable examples"
    assert len(skipped) <= len(runnable), f"{len(skipped)} blocks do not run: {skipped}"


def test_every_no_run_marker_stands_before_a_python_block():
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if NO_RUN.match(line):
                following = next((x for x in lines[n + 1:] if x.strip()), "")
                assert re.match(r"^\s*```(python|py)\b", following), (
                    f"{page.relative_to(REPO_ROOT)}:{n + 1}: no-run marker before no python block")


def _run(block: Block, cwd: Path) -> str | None:
    """None when the block ran and exited 0; else what went wrong."""
    script = cwd / "example.py"
    script.write_text(block.code, encoding="utf-8")
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("RABBITMQ_", "REDIS_"))}
    env["PYTHONPATH"] = str(REPO_ROOT)
    try:
        result = subprocess.run([sys.executable, str(script)], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S,
                                check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{block.page}:{block.line}: still running after {BLOCK_TIMEOUT_S} s"
    if result.returncode != 0:
        return f"{block.page}:{block.line}: exit {result.returncode}\n{result.stderr[-2000:]}"
    return None


@pytest.mark.parametrize("page", sorted({b.page for b in BLOCKS if b.no_run is None}))
def test_each_python_example_of_the_page_runs(page: str, tmp_path: Path):
    blocks = [b for b in BLOCKS if b.page == page and b.no_run is None]
    dirs = []
    for n, _block in enumerate(blocks):
        (tmp_path / str(n)).mkdir()
        dirs.append(tmp_path / str(n))
    with ThreadPoolExecutor(max_workers=4) as pool:
        failures = [f for f in pool.map(_run, blocks, dirs) if f]
    assert failures == [], "\n\n".join(failures)
