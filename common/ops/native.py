"""Builds the fleet's C modules in place: ``python -m common.ops.native [--optional]``.

Three modules, each a hot loop of the default page (NOTES #83): ``common/work/_text_measure.c``
(the text measures' one pass, imported by ``common.work.page``), ``common/work/_links.c``
(plain links resolved, imported by ``common.work.links``) and ``common/work/_scan.c`` (a raw
body's "<" counted, imported by ``common.work.parse_lexbor``), each compiled with the interpreter's
own compiler settings (``sysconfig``: CC, the include directory) into ``<name><EXT_SUFFIX>``
beside its source. scripts/bootstrap.sh runs this after installing the locks, the
Dockerfile in a build stage of its own (the compiler stays out of the image); ``pip install .``
builds it through pyproject.toml's ext-modules. Without it the fleet runs the same measures in
Python (~10 % more CPU a page; the worker says so at start).

Exit status: 0 built (or, with ``--optional``, nothing to build it with: a C compiler or
Python.h is missing, said on stderr); 1 the build failed; 2 nothing to build it with and not
``--optional``.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
#: (module, source): the module's dotted name and its C file, relative to the checkout.
MODULES = (("common.work._text_measure", "common/work/_text_measure.c"),
           ("common.work._links", "common/work/_links.c"),
           ("common.work._scan", "common/work/_scan.c"))
#: What the sources include from beside them (a build elsewhere copies it along).
HEADERS = ("common/work/_module.h",)
#: The bytes loops want -O3 (gcc vectorises and unrolls them): 20 against 27 us at -O2.
OPTIMIZE = ["-O3"]


def unbuilt() -> list[str]:
    """The modules of MODULES that cannot be imported (not built, or built for another
    Python): the fleet runs their Python passes."""
    missing = []
    for module, _source in MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    return missing


def compiler() -> list[str] | None:
    """The C compiler command the interpreter was built with (or ``cc``), if it exists."""
    configured = shlex.split(sysconfig.get_config_var("CC") or "cc")
    if configured and shutil.which(configured[0]):
        return configured
    return ["cc"] if shutil.which("cc") else None


def missing_tools() -> str | None:
    """What is missing to build the modules (None when nothing is)."""
    if compiler() is None:
        return "no C compiler (cc): on Debian, apt-get install gcc"
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").exists():
        return (f"no Python.h in {include}: on Debian, apt-get install python3-dev "
                "(for the distribution's python3)")
    return None


def build(module: str, source: str, root: Path = ROOT) -> Path:
    """Compile ``source`` into ``module``'s extension file beside it; return its path.

    Raises:
        subprocess.CalledProcessError: the compiler failed (its output is on stderr).
    """
    target = root / (module.replace(".", "/") + sysconfig.get_config_var("EXT_SUFFIX"))
    cc = compiler() or ["cc"]
    flags = shlex.split(sysconfig.get_config_var("CCSHARED") or "-fPIC")
    # Written aside and renamed: a worker importing it meanwhile sees the old file or the new.
    fd, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    os.close(fd)
    try:
        subprocess.run([*cc, *OPTIMIZE, *flags, "-shared", "-Wall",
                        f"-I{sysconfig.get_paths()['include']}", "-o", partial,
                        str(root / source)], check=True)
        os.chmod(partial, 0o755)
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--optional", action="store_true",
                        help="exit 0 when no compiler or Python.h is there (the fleet "
                             "then runs its Python passes)")
    args = parser.parse_args(argv)
    missing = missing_tools()
    if missing is not None:
        print(f"native: cannot build the C modules: {missing}; the fleet uses its Python "
              "passes (~10 % more CPU a page)", file=sys.stderr)
        return 0 if args.optional else 2
    for module, source in MODULES:
        try:
            target = build(module, source)
        except subprocess.CalledProcessError as exc:
            print(f"native: building {module} failed (exit {exc.returncode})", file=sys.stderr)
            return 1
        print(f"native: built {target.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
