"""The oldest supported Python installs and runs the project: Debian 12's /usr/bin/python3.

pyproject.toml's requires-python says 3.11; the oldest 3.11 a user meets is Debian 12's system
Python, 3.11.2 (Ubuntu 24.04's is 3.12). scripts/bootstrap.sh makes .venv on
/usr/bin/python3 when it is 3.11 or later, from the hash-checked locks, so the whole suite runs
on it, in CI (a fresh Debian 12 whose ``python3`` on PATH is a newer pyenv build) and wherever
.venv was made since: the test below fails under CI otherwise. README's plain ``pip install .``
on it is the first step of the newcomer's session (tests/ops/test_local_mode.py). On a 3.12
(Ubuntu 24.04's), where one is at hand: the hash-checked runtime lock (wheels only) and the
package on top with ``--no-deps`` in a fresh venv, then every module imported and
``scrape-fleet --help``.

The installs need the package index (pip's cache makes them quick). Where /usr/bin/python3 is
missing or older than requires-python, or .venv runs another Python: a skip locally, a failure
under CI=true, which runs on Debian 12.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.helpers import REPO_ROOT

SYSTEM_PYTHON = Path("/usr/bin/python3")
#: The package's own files, copied so that nothing comes from the checkout (no devtools, no tests).
PACKAGE_FILES = ("pyproject.toml", "README.md", "requirements.txt", "requirements.lock")


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def _unavailable(message: str) -> None:
    """A failure under CI=true (Debian 12 has /usr/bin/python3 3.11.2), else a skip."""
    if _in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _requires_python() -> SpecifierSet:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    return SpecifierSet(project["requires-python"])


def _describe(python: str | Path) -> tuple[str, str]:
    """(version, base prefix) of an interpreter."""
    result = subprocess.run(
        [str(python), "-c", "import sys; print(sys.version.split()[0]); print(sys.base_prefix)"],
        capture_output=True, text=True, timeout=60, check=True)
    version, prefix = result.stdout.split("\n")[:2]
    return version, prefix


@pytest.fixture(scope="module")
def oldest_python() -> Path:
    """/usr/bin/python3, checked to be a Python that requires-python admits."""
    if not SYSTEM_PYTHON.exists():
        _unavailable(f"{SYSTEM_PYTHON} missing: the oldest supported Python is Debian 12's")
    version, _ = _describe(SYSTEM_PYTHON)
    if Version(version) not in _requires_python():
        _unavailable(f"{SYSTEM_PYTHON} is {version}, which requires-python "
                     f"{_requires_python()} excludes")
    return SYSTEM_PYTHON


@pytest.fixture(scope="module")
def package_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("oldest-python") / "source"
    source.mkdir()
    for name in PACKAGE_FILES:
        shutil.copy2(REPO_ROOT / name, source / name)
    for package in ("scrape_fleet", "common"):
        shutil.copytree(REPO_ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return source


def _fresh_venv(python: Path, where: Path) -> Path:
    subprocess.run([str(python), "-m", "venv", str(where)], check=True, timeout=120)
    return where / "bin" / "python"


def _run(*command: str | Path, cwd: Path | None = None,
         timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    result = subprocess.run([str(part) for part in command], cwd=cwd, env=env,
                            capture_output=True, text=True, timeout=timeout, check=False)
    shown = " ".join(str(part) for part in command)
    assert result.returncode == 0, f"`{shown}` exited {result.returncode}:\n" + (
        result.stdout[-3000:] + result.stderr[-3000:])
    return result


def _pip(python: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return _run(python, "-m", "pip", "--disable-pip-version-check", "-q", *args)


def _check_runs(python: Path, source: Path) -> None:
    """Dependencies consistent, every module of the package imports, the console script runs."""
    _pip(python, "check")
    imports = ("import importlib, pkgutil, common\n"
               "for m in pkgutil.walk_packages(common.__path__, 'common.'):\n"
               "    importlib.import_module(m.name)\n")
    # From the source's parent, so that `common` is the installed package, not the copy.
    _run(python, "-c", imports, cwd=source.parent)
    usage = _run(python.parent / "scrape-fleet", "--help", cwd=source.parent).stdout
    assert usage.startswith("usage: scrape-fleet"), usage[:300]


def test_requires_python_bootstrap_and_the_oldest_system_pythons_agree():
    """requires-python admits Debian 12's and Ubuntu 24.04's Pythons, not 3.10; bootstrap's floor
    for the Python it makes .venv with is requires-python's."""
    requires = _requires_python()
    for version in ("3.11.2", "3.12.3", "3.13.0"):
        assert Version(version) in requires, (version, str(requires))
    assert Version("3.10.12") not in requires, str(requires)
    bootstrap = (REPO_ROOT / "scripts/bootstrap.sh").read_text()
    floor = re.search(r"sys\.version_info < \((\d+), (\d+)\)", bootstrap)
    assert floor, "scripts/bootstrap.sh: python_ok's version check not found"
    lowest = min(Version(spec.version) for spec in requires if spec.operator == ">=")
    assert (int(floor.group(1)), int(floor.group(2))) == (lowest.major, lowest.minor), (
        floor.group(0), str(requires))


def test_the_suite_runs_on_the_oldest_system_python(oldest_python: Path):
    """.venv (scripts/bootstrap.sh) runs on /usr/bin/python3, so the whole suite proves it."""
    wanted = _describe(oldest_python)
    running = (sys.version.split()[0], sys.base_prefix)
    if running != wanted:
        _unavailable(f"this suite runs on Python {running[0]} from {running[1]}, not "
                     f"{oldest_python}'s {wanted[0]} (from {wanted[1]}): "
                     "rm -rf .venv && bash scripts/bootstrap.sh")


def _locked_install_runs(base: Path, where: Path, source: Path) -> Path:
    # --no-compile: no .pyc for the ~50 packages at install (pip ignores compile errors
    # anyway); what runs is compiled when _check_runs imports it.
    python = _fresh_venv(base, where)
    _pip(python, "install", "--no-compile", "--require-hashes", "--only-binary=:all:", "-r",
         source / "requirements.lock")
    _pip(python, "install", "--no-compile", "--no-deps", source)
    _check_runs(python, source)
    return python


def _python_3_12() -> Path | None:
    """A CPython 3.12 (Ubuntu 24.04's system Python is 3.12): /usr/bin/python3.12 or python3.12 on
    PATH, else the newest of pyenv's 3.12s; the first that runs (a pyenv shim may not)."""
    candidates = [Path("/usr/bin/python3.12")]
    if shutil.which("python3.12"):
        candidates.append(Path(shutil.which("python3.12")))
    versions = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates += sorted(versions.glob("3.12.*/bin/python3.12"), reverse=True,
                         key=lambda path: [int(part) for part in re.findall(
                             r"\d+", path.parent.parent.name)])
    for candidate in candidates:
        if not candidate.exists():
            continue
        try:
            version, _ = _describe(candidate)
        except (OSError, subprocess.SubprocessError):
            continue  # a shim without a 3.12 behind it
        if version.startswith("3.12."):
            return candidate
    return None


@pytest.mark.slow
def test_the_lock_and_the_package_install_and_run_on_python_3_12(package_source: Path):
    """Ubuntu 24.04's Python, where one is at hand (pyenv's on these machines; no CI failure
    without it: the oldest is the one CI must prove)."""
    python = _python_3_12()
    if python is None:
        pytest.skip("no Python 3.12 here (python3.12 on PATH or pyenv's)")
    _locked_install_runs(python, package_source.parent / "locked-3.12", package_source)
