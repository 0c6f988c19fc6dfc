"""The fleet's C hot loops held to their Python passes: the text measures
(common/work/_text_measure.c against page.solid_text_python) and the links
(common/work/_links.c against links.extract_links_python); and the builder that compiles them."""

from __future__ import annotations

import importlib.util
import random
import re
import shutil
from pathlib import Path

import pytest
import xxhash

from common.ops import native
from common.work import links, page, parse_lexbor
from tests.helpers import unavailable

ALPHABET = [" ", "\t", "\n", "\r", "\f", "  ", "a", "bc", "é", "中", "\u00a0", "\U0001f600",
            "\ud800", "\udfff", "\x0b", "\u3000", "\x00", "\x80"]


def _definition(text: str) -> tuple[int, bytes]:
    collapsed = re.sub(r"[ \t\n\r\f]+", " ", text).strip(" ")
    return len(collapsed), re.sub(r"[ \t\n\r\f]+", "", text).encode("utf-8", "surrogatepass")


def _random_texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 14)))
            for _ in range(count)]


def _built(module: str) -> None:
    """Built by bootstrap (and the image): missing is a failure in CI, else a skip."""
    if module in native.unbuilt():
        unavailable(f"{module} is not built: scripts/bootstrap.sh builds it "
                    "(python -m common.ops.native)")


@pytest.fixture(scope="module")
def native_pass():
    _built("common.work._text_measure")
    return page.solid_text


@pytest.fixture(scope="module")
def native_links():
    _built("common.work._links")
    return links.resolve_all


def test_the_python_pass_gives_the_collapsed_length_and_the_squeezed_bytes():
    for text in _random_texts(5000, 20261127):
        assert page.solid_text_python(text) == _definition(text), repr(text)


def test_the_c_pass_gives_what_the_python_pass_gives_on_random_texts(native_pass):
    for text in _random_texts(20000, 83):
        assert native_pass(text) == page.solid_text_python(text) == _definition(text), \
            repr(text)


#: One alphabet per str storage the C pass reads sixteen characters at a time (one byte a
#: character, ASCII or not; two bytes, with blocks over U+00FF and blocks under it).
BLOCK_ALPHABETS = {
    "ascii": [" ", "\t", "\n", "\r", "\f", "a", "Z", "\x0b", "\x00", "\x7f", "  "],
    "latin-1": [" ", "\n", "\f", "a", "\x0b", "\x7f", "\x80", "é", "\xff", "\xa0", "  "],
    "two bytes": [" ", "\t", "\r", "a", "\x80", "\xff", "\u0100", "\u3000", "\uff20", "é",
                  "\u2019", "aaaaaaaa", "        ", "\ud800"],
}


@pytest.mark.parametrize("storage", BLOCK_ALPHABETS)
def test_the_c_pass_reads_blocks_of_sixteen_as_one_character_at_a_time(native_pass, storage):
    rng = random.Random(f"blocks {storage}")
    alphabet = BLOCK_ALPHABETS[storage]
    for _ in range(6000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 70)))
        assert native_pass(text) == _definition(text), repr(text)


def test_the_c_pass_reads_a_long_text_and_its_edges(native_pass):
    long_text = " \n".join(f"word{i} é {i}" for i in range(20000)) + "\t"
    for text in ("", " ", "a", " a", "a ", "\ud800", "\ud800 \ud800", long_text):
        assert native_pass(text) == page.solid_text_python(text), repr(text[:40])


def test_the_c_pass_refuses_what_is_not_a_str(native_pass):
    with pytest.raises(TypeError, match="takes a str"):
        native_pass(b"bytes")


def test_measure_text_hashes_the_solid_text_whichever_pass_runs(monkeypatch):
    text = "  Héllo,\n\tworld  \ud800 "
    digest = xxhash.xxh3_128_hexdigest("Héllo,world\ud800".encode("utf-8", "surrogatepass"))
    assert page.measure_text(text) == (14, digest)
    monkeypatch.setattr(page, "solid_text", page.solid_text_python)
    assert page.measure_text(text) == (14, digest)


BASES = ["https://example.com/dir/page.html", "https://example.com", "http://example.com:8080/a/b/?q=1",
         "https://user@example.com/a/b/c.html#frag", "http://[::1]:8081/x/y", "https://h.org/\u00e9t\u00e9/",
         "https://example.com/" + "d/" * 1020, "mailto:someone@example.com", "http:///nohost"]
HREF_PIECES = ["http://", "https://", "HTTP://", "//", "/", "./", "../", "/.", ".", "#", "?", "q=1",
               "a", "B", "p.html", "x:y", "mailto:", "javascript:", " ", "\t", "\n", "\r", "\f",
               "\x0b", "\x7f", "é", "\\", "%2E", ":", "@", "h.org", "h.org:80", "[::1]", "-", "+",
               "1", "a" * 600]


def test_the_c_links_give_what_the_python_loop_gives_on_random_hrefs_and_bases(native_links):
    rng = random.Random(8302)
    for _ in range(3000):
        base = links.make_base(rng.choice(BASES))
        hrefs = ["".join(rng.choice(HREF_PIECES) for _ in range(rng.randint(0, 6)))
                 for _ in range(rng.randint(0, 12))]
        hrefs += rng.sample(hrefs, min(len(hrefs), 3))  # repeats, as menus have
        max_links = rng.choice([1, 3, 10_000])
        assert links.extract_links(hrefs, base, max_links) == \
            links.extract_links_python(hrefs, base, max_links), (base, hrefs, max_links)


def test_the_c_links_resolve_the_plain_shapes_themselves(native_links):
    base = links.make_base("http://example.com:8080/a/b.html")
    hrefs = ["http://o.org/p#f", "/root?x=1#f", "rel.html", "#top", "", "  /sp  ", "https://",
             "http:///nohost", "http://o.org/p", "/root?x=1"]
    asked: list[str] = []

    def resolve(href: str, base: links.Base) -> str | None:
        asked.append(href)
        return links.resolve(href, base)

    found, truncated = native_links(hrefs, base, 100, links.MAX_URL_CHARS, resolve)

    assert asked == []  # every one of these is a plain shape
    assert found == ("http://o.org/p", "http://example.com:8080/root?x=1",
                     "http://example.com:8080/a/rel.html", "http://example.com:8080/a/b.html",
                     "http://example.com:8080/sp")
    assert truncated is False
    assert native_links(["/x", "//cdn.net/y", "../z"], base, 100, links.MAX_URL_CHARS,
                        resolve)[0] == (
        "http://example.com:8080/x", "http://cdn.net/y", "http://example.com:8080/z")
    assert asked == ["//cdn.net/y", "../z"]  # the other shapes go to links.resolve


def test_the_c_links_stop_at_max_links_and_say_so(native_links):
    base = links.make_base("https://example.com/")
    hrefs = [f"/p/{i}" for i in range(5)] + ["/p/0"]
    assert links.extract_links(hrefs, base, 3) == (
        ("https://example.com/p/0", "https://example.com/p/1", "https://example.com/p/2"), True)
    assert links.extract_links(hrefs, base, 5)[1] is False


def test_the_c_links_pass_on_what_resolve_raises(native_links):
    base = links.make_base("https://example.com/")
    with pytest.raises(AttributeError):
        links.extract_links(["/ok", 7], base, 10)  # type: ignore[list-item]


@pytest.fixture(scope="module")
def native_count():
    _built("common.work._scan")
    return parse_lexbor.count_byte


def test_the_c_count_gives_what_bytes_count_gives_on_random_bodies(native_count):
    rng = random.Random(1700)
    # Lengths around the sixteen-byte blocks and the 255-block sums; bytes from a small set,
    # so each one counted occurs often, and from all 256.
    for size in [*range(0, 70), 4079, 4080, 4081, 4096, 8161, 65_536 + 7]:
        for pool in (b"<a/ \xff", bytes(range(256))):
            data = bytes(rng.choice(pool) for _ in range(size))
            for byte in (ord("<"), 0, 255, ord(" ")):
                assert native_count(data, byte) == data.count(bytes((byte,))) \
                    == parse_lexbor.count_byte_python(data, byte), (size, byte)
    assert native_count(b"<" * 100_000, ord("<")) == 100_000  # a lane summed past 255 blocks
    assert native_count(bytearray(b"a<b<"), ord("<")) == 2


def test_the_c_count_refuses_a_byte_out_of_range_or_not_bytes(native_count):
    with pytest.raises(ValueError, match="range"):
        native_count(b"abc", 256)
    with pytest.raises(TypeError):
        native_count("text", ord("<"))
    with pytest.raises(TypeError, match="an int"):
        native_count(b"abc", b"<")


@pytest.mark.skipif(native.missing_tools() is not None, reason="no C compiler or Python.h")
def test_the_builder_compiles_an_importable_module_beside_its_source(tmp_path: Path):
    module, source = native.MODULES[0]  # the text measures

    target = native.build(module, source, root=_sources_in(tmp_path, source))

    assert target.parent == (tmp_path / source).parent
    # Nothing else is left beside it (the partial file is renamed into place).
    assert {p.name for p in target.parent.iterdir()} == {
        target.name, Path(source).name, *(Path(h).name for h in native.HEADERS)}
    assert _imported(module, target).solid_text(" a  b ") == (3, b"ab")


def _sources_in(root: Path, source: str) -> Path:
    """``root`` holding a copy of ``source`` and the headers it includes."""
    (root / source).parent.mkdir(parents=True, exist_ok=True)
    for name in (source, *native.HEADERS):
        shutil.copy(native.ROOT / name, root / name)
    return root


def _imported(module: str, target: Path):
    spec = importlib.util.spec_from_file_location(module, target)
    built = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(built)
    return built


def _built_aside(tmp_path: Path, module: str, source: str):
    return _imported(module, native.build(module, source, root=_sources_in(tmp_path, source)))


@pytest.mark.skipif(native.missing_tools() is not None, reason="no C compiler or Python.h")
def test_the_c_loops_built_without_sse2_as_on_arm_give_what_the_python_passes_give(
        tmp_path: Path, monkeypatch):
    # Where the compiler has no SSE2 (an ARM image), the sixteen-at-a-time blocks are left out
    # and every loop goes one character or byte at a time: that form is held here too.
    monkeypatch.setattr(native, "OPTIMIZE", [*native.OPTIMIZE, "-U__SSE2__"])
    sources = dict(native.MODULES)
    text = _built_aside(tmp_path, "common.work._text_measure",
                        sources["common.work._text_measure"])
    scan = _built_aside(tmp_path, "common.work._scan", sources["common.work._scan"])
    for storage, alphabet in BLOCK_ALPHABETS.items():
        rng = random.Random(f"one at a time {storage}")
        for _ in range(2000):
            sample = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 70)))
            assert text.solid_text(sample) == _definition(sample), repr(sample)
    rng = random.Random(1701)
    for size in (0, 15, 16, 17, 4081, 9000):
        data = bytes(rng.choice(b"<a/ \xff") for _ in range(size))
        assert scan.count_byte(data, ord("<")) == data.count(b"<"), size


def test_without_a_compiler_the_builder_says_so_and_fails_unless_optional(monkeypatch, capsys):
    monkeypatch.setattr(native, "compiler", lambda: None)

    assert native.main([]) == 2
    assert "no C compiler" in capsys.readouterr().err
    assert native.main(["--optional"]) == 0
    assert "uses its Python passes" in capsys.readouterr().err
