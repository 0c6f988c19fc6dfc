"""Every command in the fenced shell blocks (```bash, ```sh, ```shell) of README.md and of every
page under docs/ (other sessions' pages included, as soon as they exist) runs as written, or,
where running it would start something long-lived or change the fleet, its ``--help`` does.

The rule, one kind of command at a time (:func:`classify`):

- **Ours** (``scrape-fleet``, ``python X.py`` for a root script, ``python -m MODULE``,
  ``.venv/bin/python -m MODULE``, and ``bash bench/run.sh``, which hands its arguments to
  ``python -m bench.run``): they start workers, sinks, local fleets and benchmarks, or change
  the queues, so ``PROGRAM [SUBCOMMAND ...] --help`` runs instead, and every option the README
  gives them (``--x``, ``-x``) must be in that help: a renamed or removed option fails here.
  ``scrape-fleet`` is run as ``python -m common.ops.console``, the function pyproject.toml's
  console script names (checked below).
- **Tools of the venv** (``.venv/bin/warcio check ...``, ``.venv/bin/mkdocs serve``): their
  ``--help`` likewise.
- **Shell utilities** (``cp``, ``echo``, ``printf``, ``set``, ``python3 -c``, a bare
  ``VAR=value``...): run as written, in order, one bash per block with ``set -e``, in a
  temporary copy of the working tree, so a block that writes ``.env`` then reads it works
  (blocks run in page order, README first, then docs/ by path).
- **Skipped, with the reason**: ``docker``/``docker compose``/``docker-compose``, ``kubectl``,
  ``helm``, ``kind`` (they need a Docker engine or a Kubernetes cluster; tests/test_compose*.py
  and tests/test_deploy.py check the files they read); ``bash scripts/test.sh`` and
  ``bash scripts/run_local.sh`` (CI runs the first, tests/test_end_to_end.py the fleet the
  second starts; both take minutes); ``pip install`` (tests/ops/test_local_mode.py runs it in
  a fresh venv); ``apt-get``/``sudo`` (they change the machine); ``rabbitmqctl`` (it
  administers a running broker).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, TEST_ENV

README = REPO_ROOT / "README.md"
#: README first, then every page of the docs site.
PAGES = (README, *sorted((REPO_ROOT / "docs").rglob("*.md")))
SHELL_FENCES = {"bash", "sh", "shell"}
SKIPPED = {
    ("docker",): "needs a Docker engine (tests/test_compose*.py check the compose file)",
    ("docker-compose",): "needs a Docker engine (tests/test_compose*.py check the compose file)",
    ("kubectl",): "needs a Kubernetes cluster (tests/test_deploy.py checks the manifests)",
    ("helm",): "needs a Kubernetes cluster (tests/test_deploy.py checks the manifests)",
    ("kind",): "needs a Docker engine (tests/test_deploy.py checks the manifests)",
    ("bash", "scripts/test.sh"): "the test suite itself: CI runs exactly this command",
    ("bash", "scripts/run_local.sh"): "the demo, minutes long (tests/test_end_to_end.py)",
    ("pip", "install"): "run in a fresh venv by tests/ops/test_local_mode.py",
    ("apt-get",): "changes the machine",
    ("sudo",): "changes the machine",
    ("rabbitmqctl",): "administers a running broker (tests/broker/test_quorum.py runs a cluster)",
}
#: Programs whose --help is run instead of the command (see the module docstring).
PYTHONS = {"python", "python3", ".venv/bin/python"}


@dataclass
class Command:
    line: int
    text: str
    words: list[str] = field(default_factory=list)


def shell_blocks(text: str) -> list[list[Command]]:
    """The commands of every fenced shell block, continuation lines joined, comments dropped."""
    blocks: list[list[Command]] = []
    fence = None
    pending, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if fence is None:
            match = re.match(r"^```(\w*)\s*$", line)
            if match:
                fence = match.group(1)
                if fence in SHELL_FENCES:
                    blocks.append([])
            continue
        if line.startswith("```"):
            fence = None
            continue
        if fence not in SHELL_FENCES:
            continue
        if not pending:
            start = number
        pending += line[:-1] + " " if line.endswith("\\") else line
        if line.endswith("\\"):
            continue
        words = shlex.split(pending, comments=True)
        if words:
            blocks[-1].append(Command(start, pending.strip(), words))
        pending = ""
    return [block for block in blocks if block]


def _program(words: list[str]) -> list[str]:
    """The words after leading VAR=value assignments."""
    n = 0
    while n < len(words) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[n]):
        n += 1
    return words[n:]


def classify(command: Command) -> tuple[str, object]:
    """("skip", reason), ("help", (program, arguments)) or ("shell", None)."""
    words = _program(command.words)
    if not words:
        return "shell", None
    for prefix, reason in SKIPPED.items():
        if tuple(words[:len(prefix)]) == prefix:
            return "skip", reason
    if words[0] == "scrape-fleet":
        return "help", ([sys.executable, "-m", "common.ops.console"], words[1:])
    if words[0].startswith(".venv/bin/") and words[0] not in PYTHONS:  # a tool of the venv
        return "help", ([str(REPO_ROOT / words[0])], words[1:])
    if words[:2] == ["bash", "bench/run.sh"]:
        return "help", ([sys.executable, "-m", "bench.run"], words[2:])
    if words[0] in PYTHONS and len(words) > 1:
        if words[1] == "-m":
            return "help", ([sys.executable, "-m", words[2]], words[3:])
        if (REPO_ROOT / words[1]).is_file() and "/" not in words[1]:
            return "help", ([sys.executable, words[1]], words[2:])
    return "shell", None


def _subcommands(help_text: str) -> set[str]:
    """The subcommands a help lists: argparse's {a,b} in its usage, or click's Commands:."""
    usage = help_text.split("\n\n")[0]
    choices = re.findall(r"\{([\w,-]+)\}", usage)
    names = set(choices[0].split(",")) if choices else set()
    click = re.search(r"^Commands:\n((?:  .*\n?)+)", help_text, re.M)
    if click:
        names |= set(re.findall(r"^  (\w[\w-]*)", click.group(1), re.M))
    return names


@cache
def _run_help(command: tuple[str, ...]) -> subprocess.CompletedProcess:
    """``command --help``, once per session (the pages repeat commands)."""
    env = dict(os.environ, **TEST_ENV, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([*command, "--help"], cwd=REPO_ROOT, env=env, text=True,
                          capture_output=True, timeout=120, check=False)


def _help(program: list[str], args: list[str]) -> tuple[list[str], subprocess.CompletedProcess]:
    """``program [SUBCOMMAND ...] --help``: leading words the usage lists as {choices} are
    subcommands and are kept."""
    command = list(program)
    for word in [*args, None]:
        result = _run_help(tuple(command))
        if word is None or word not in _subcommands(result.stdout):
            return command, result
        command.append(word)
    raise AssertionError("unreachable: the loop returns at the latest on None")


@pytest.fixture(scope="session")
def work_tree_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository's files (tracked, and untracked ones git does not ignore) in a temp dir."""
    target = tmp_path_factory.mktemp("readme-tree")
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"],
                            cwd=REPO_ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


BLOCKS = [(page.relative_to(REPO_ROOT), block) for page in PAGES
          for block in shell_blocks(page.read_text(encoding="utf-8"))]


def test_the_readme_has_the_quick_start_commands_to_check():
    commands = [c.text for page, block in BLOCKS if page == Path("README.md") for c in block]
    for expected in ("pip install .", "scrape-fleet up", "scrape-fleet produce -f urls.txt",
                     "scrape-fleet status --watch", "scrape-fleet export -o results.jsonl",
                     "scrape-fleet down", "bash scripts/run_local.sh", "bash scripts/test.sh"):
        assert expected in commands


def test_scrape_fleet_is_the_console_script_these_checks_run():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["scrape-fleet"] == "common.ops.console:main"


def test_the_docs_pages_have_commands_to_check():
    pages = {page for page, _block in BLOCKS}
    for page in ("docs/getting-started.md", "docs/operations.md", "docs/deployment.md"):
        assert Path(page) in pages


@pytest.mark.parametrize(("page", "block"), BLOCKS,
                         ids=[f"{page}:line{block[0].line}" for page, block in BLOCKS])
def test_each_command_of_readme_and_docs_runs_or_its_help_does(
        page: Path, block: list[Command], work_tree_copy: Path):
    failures, skipped, shell = [], [], []
    for command in block:
        kind, detail = classify(command)
        if kind == "skip":
            skipped.append(f"{command.text}: {detail}")
        elif kind == "help":
            program, args = detail  # type: ignore[misc]
            ran, result = _help(program, args)
            shown = " ".join(ran[2:] if ran[1:2] == ["-m"] else [Path(ran[0]).name, *ran[1:]])
            if result.returncode != 0 or "usage:" not in result.stdout.lower():
                failures.append(f"{page}:{command.line}: `{shown} --help` exited "
                                f"{result.returncode}: {result.stderr[-500:]}")
                continue
            options = {w.split("=")[0] for w in args if re.match(r"^--?[A-Za-z][\w-]*", w)}
            unknown = sorted(o for o in options if not re.search(
                rf"(?<![\w-]){re.escape(o)}(?![\w-])", result.stdout))
            if unknown:
                failures.append(f"{page}:{command.line}: {command.text!r}: {unknown} not in "
                                f"`{shown} --help`")
        else:
            shell.append(command)
    if shell:
        script = "set -euo pipefail\n" + "\n".join(c.text for c in shell)
        result = subprocess.run(["bash", "-c", script], cwd=work_tree_copy, text=True,
                                capture_output=True, timeout=120, check=False,
                                env=dict(os.environ, HOME=str(work_tree_copy)))
        if result.returncode != 0:
            failures.append(f"{page} lines {[c.line for c in shell]} (run as written) exited "
                            f"{result.returncode}: {result.stderr[-500:]}")
    assert not failures, "\n".join(failures)
    if skipped and not shell and len(skipped) == len(block):
        pytest.skip("; ".join(skipped))
