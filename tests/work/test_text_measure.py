"""The text measures' two passes, C (common/work/_text_measure.c) and Python
(page.solid_text_python), held to one definition, and the builder that compiles the C one."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from common.ops import native
from common.work import page

ALPHABET = [" ", "\t", "\n", "\r", "\f", "  ", "a", "bc", "é", "中", "\u00a0", "\U0001f600",
            "\ud800", "\udfff", "\x0b", "\u3000", "\x00", "\x80"]


def _definition(text: str) -> tuple[int, bytes]:
    collapsed = re.sub(r"[ \t\n\r\f]+", " ", text).strip(" ")
    return len(collapsed), re.sub(r"[ \t\n\r\f]+", "", text).encode("utf-8", "surrogatepass")


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 14)))
            for _ in range(count)]


@pytest.fixture(scope="module")
def native_pass():
    """The C pass; built by bootstrap (and the image), so missing is a failure in CI."""
    if not page.NATIVE_TEXT_MEASURE:
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail("common.work._text_measure is not built: scripts/bootstrap.sh builds "
                        "it (python -m common.ops.native)")
        pytest.skip("common.work._text_measure is not built (python -m common.ops.native)")
    return page.solid_text


def test_the_python_pass_gives_the_collapsed_length_and_the_squeezed_bytes():
    for text in _random_texts(5000, 20261127):
        assert page.solid_text_python(text) == _definition(text), repr(text)


def test_the_c_pass_gives_what_the_python_pass_gives_on_random_texts(native_pass):
    for text in _random_texts(20000, 83):
        assert native_pass(text) == page.solid_text_python(text) == _definition(text), \
            repr(text)


def test_the_c_pass_reads_a_long_text_and_its_edges(native_pass):
    long_text = " \n".join(f"word{i} é {i}" for i in range(20000)) + "\t"
    for text in ("", " ", "a", " a", "a ", "\ud800", "\ud800 \ud800", long_text):
        assert native_pass(text) == page.solid_text_python(text), repr(text[:40])


def test_the_c_pass_refuses_what_is_not_a_str(native_pass):
    with pytest.raises(TypeError, match="takes a str"):
        native_pass(b"bytes")


def test_measure_text_hashes_the_solid_text_whichever_pass_runs(monkeypatch):
    text = "  Héllo,\n\tworld  \ud800 "
    digest = hashlib.blake2b("Héllo,world\ud800".encode("utf-8", "surrogatepass"),
                             digest_size=page.HASH_DIGEST_BYTES).hexdigest()
    assert page.measure_text(text) == (14, digest)
    monkeypatch.setattr(page, "solid_text", page.solid_text_python)
    assert page.measure_text(text) == (14, digest)


@pytest.mark.skipif(native.missing_tools() is not None, reason="no C compiler or Python.h")
def test_the_builder_compiles_an_importable_module_beside_its_source(tmp_path: Path):
    module, source = native.MODULES[0]
    (tmp_path / source).parent.mkdir(parents=True)
    shutil.copy(native.ROOT / source, tmp_path / source)

    target = native.build(module, source, root=tmp_path)

    assert target.parent == (tmp_path / source).parent
    # Nothing else is left beside it (the partial file is renamed into place).
    assert {p.name for p in target.parent.iterdir()} == {target.name, Path(source).name}
    spec = importlib.util.spec_from_file_location(module, target)
    built = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(built)
    assert built.solid_text(" a  b ") == (3, b"ab")


def test_without_a_compiler_the_builder_says_so_and_fails_unless_optional(monkeypatch, capsys):
    monkeypatch.setattr(native, "compiler", lambda: None)

    assert native.main([]) == 2
    assert "no C compiler" in capsys.readouterr().err
    assert native.main(["--optional"]) == 0
    assert "uses the Python ones" in capsys.readouterr().err
