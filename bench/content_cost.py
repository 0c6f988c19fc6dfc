"""What a page's main content (common/work/content.py, trafilatura) costs, next to its parse.

    .venv/bin/python -m bench.content_cost [--pages 5] [--calls 20] [--rounds 3]

In-process and without services: ``--pages`` farm pages (bench/farm_pages.py, ~30 KB, ~100
links, a nav, a main of paragraphs and a footer) are each measured in CPU microseconds per
call, the ways taking turns in each round so a shared machine's load falls on all of them
(the best round counts, the median over the pages is printed):

* ``parse``: the worker's :func:`common.work.parse.parse_html` of the page's bytes;
* ``main_text`` / ``markdown``: :func:`common.work.content.extract_main` on the page's HTML
  (what ``page.main_text`` / ``page.markdown`` cost a handler);
* ``serialise tree``: ``etree.tostring`` of the worker's parsed tree, what a rules field
  ``get: markdown`` adds to hand trafilatura the page without touching the worker's tree;
* ``copy tree``: ``copy.deepcopy`` of that tree, the other way to protect it, for comparison
  (trafilatura takes lxml.html's elements, so a copy would still need a parse: not used);
* ``rules markdown``: :class:`common.work.content.PageContent` on the parsed tree
  (serialise + extract), the rules path's whole cost.

Also the first import of trafilatura (a new process pays it once) and one 1 MiB page (the
input cap, :data:`common.work.content.MAX_INPUT_BYTES`).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lxml import etree  # noqa: E402

from bench.farm_pages import Site, page_html, paragraph_pool  # noqa: E402
from common.work.content import MAX_INPUT_BYTES, PageContent, extract_main  # noqa: E402
from common.work.parse import parse_html  # noqa: E402

CONTENT_TYPE = "text/html; charset=utf-8"
ROOT = Path(__file__).resolve().parent.parent


def farm_pages(count: int) -> list[tuple[str, str]]:
    """Pages 1..count of site 0 of a 10-site farm: ``(url, html)``."""
    sites = [Site(i, f"127.0.0.{i + 2}", 8080) for i in range(10)]
    pool = paragraph_pool()
    return [(sites[0].page_url(n), page_html(sites[0], n, 2000, sites, pool))
            for n in range(1, count + 1)]


def tree_of(url: str, body: bytes) -> tuple[etree._Element, str]:
    """The worker's tree of a page (scripts and styles stripped) and its base URL."""
    trees: list[tuple[etree._Element, str]] = []
    parse_html(body, url, CONTENT_TYPE, on_tree=lambda root, base: trees.append((root, base)))
    return trees[0]


def best_us(calls: int, rounds: int, ways: dict[str, Callable[[], object]]) -> dict[str, float]:
    """CPU microseconds per call of each way: the best of ``rounds`` rounds, ways in turn."""
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for name, call in ways.items():
            call()  # warm
            started = time.process_time_ns()
            for _ in range(calls):
                call()
            best[name] = min(best[name], (time.process_time_ns() - started) / calls / 1e3)
    return best


def import_s() -> float:
    """Wall seconds a new process spends importing trafilatura (the best of three)."""
    code = ("import time; t = time.perf_counter(); import trafilatura; "
            "print(time.perf_counter() - t)")
    return min(float(subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True,
                                    capture_output=True, text=True).stdout) for _ in range(3))


def main(argv: list[str] | None = None) -> None:
    """Print the median CPU cost per page of each way, and the ratios to the parse."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20, help="per way, per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    print(f"first import of trafilatura: {import_s() * 1000:.0f} ms (once per process)")
    results: dict[str, list[float]] = {}
    for url, html in farm_pages(args.pages):
        body = html.encode()
        root, base = tree_of(url, body)
        ways = {
            "parse": lambda body=body, url=url: parse_html(body, url, CONTENT_TYPE),
            "main_text": lambda html=html, url=url: extract_main(html, url, "text"),
            "markdown": lambda html=html, url=url: extract_main(html, url, "markdown"),
            "serialise tree": lambda root=root: etree.tostring(root, encoding="unicode",
                                                               method="html"),
            "copy tree": lambda root=root: copy.deepcopy(root),
            "rules markdown": lambda root=root, base=base: PageContent(root, base).get(
                "markdown"),
        }
        for name, us in best_us(args.calls, args.rounds, ways).items():
            results.setdefault(name, []).append(us)
    url, html = farm_pages(1)[0]
    markdown = extract_main(html, url, "markdown") or ""
    print(f"pages: {args.pages} farm pages of ~{len(html) // 1000} KB; "
          f"markdown of page 1: {len(markdown)} chars, {markdown.count(chr(10))} lines")
    parse_us = statistics.median(results["parse"])
    for name, values in results.items():
        us = statistics.median(values)
        print(f"{name:16s} {us:10.0f} us/page   {us / parse_us:6.1f}x parse")

    filler = html[html.index("<main>"):html.index("</main>")]
    big = html.replace("</main>", filler * (MAX_INPUT_BYTES // len(filler) + 1) + "</main>")
    started = time.process_time()
    extract_main(big, url, "markdown")
    print(f"markdown of a {len(big) / 2**20:.1f} MiB page (cut at {MAX_INPUT_BYTES // 2**20} "
          f"MiB): {(time.process_time() - started) * 1000:.0f} ms CPU")


if __name__ == "__main__":
    main()
