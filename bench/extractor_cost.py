"""What EXTRACTOR's child process costs per page, against calling the function inline.

A farm page (bench/farm_pages.py: ~30 KB, ~100 links) goes ``--pages`` times through
``parse_html`` with EXTRACTOR's hook, as PageReader runs it: first with the function called
in this process on the parsed tree (the design before NOTES #36 changed), then through
:class:`~common.work.user_extractor.UserExtractor`'s child (the body sent, re-parsed and
extracted there, the reply read back). Prints wall time and CPU per page (this process, and
the child's from /proc, start-up excluded) and the child's memory at rest.

With ``--handlers package.module:router`` (e.g. ``bench.farm_handlers:router``, the extract
phase's handler) two last rows run HANDLERS's router through the same child, and inline
(HANDLER_ISOLATION=inline: its "child CPU" column is this process's, so read the parent's).

Run from the repository root: ``python -m bench.extractor_cost [--pages 2000] [--handlers V]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

from bench.farm_pages import Site, page_html, paragraph_pool
from common.web.fetch import FetchResult
from common.work.parse import parse_html
from common.work.user_code import PageInput, check_output, load_function
from common.work.user_extractor import UserExtractor

USER_MODULE = '''
def extract(page):
    return {"data": {"h1": page.selector.css("h1::text").get(),
                     "links": len(page.root.findall(".//a")),
                     "first_paragraph": page.selector.xpath("//p/text()").get()}}
'''


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _proc_cpu_s(pid: int) -> float:
    """utime + stime of a live process (its start-up excluded by taking differences)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--handlers", default="", help="also time this HANDLERS router")
    args = parser.parse_args(argv)

    sites = [Site(i, f"127.0.0.{i + 2}", 8080) for i in range(3)]
    body = page_html(sites[0], 7, 100, sites, paragraph_pool()).encode()
    url = sites[0].page_url(7)
    response = FetchResult(url=url, final_url=url, status=200, body=body, elapsed_ms=1.0,
                           content_type="text/html; charset=utf-8",
                           headers={"content-type": "text/html; charset=utf-8",
                                    "server": "nginx"})
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "bench_user_module.py").write_text(textwrap.dedent(USER_MODULE))
        sys.path.insert(0, tmp)
        value = "bench_user_module:extract"
        function = load_function(value)

        def inline(root: Any, base_url: str) -> None:
            check_output(function(PageInput(url, 200, dict(response.headers), body,
                                      response.content_type, root, {"rule": 1})), base_url)

        def parse_only(root: Any, base_url: str) -> None:
            return None

        rows = []
        for name, make_hook in (("parse, no EXTRACTOR", lambda _r: parse_only),
                                ("parse + inline call", lambda _r: inline)):
            cpu0, wall0 = _cpu_s(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(args.pages):
                parse_html(body, url, response.content_type, on_tree=make_hook(None))
            rows.append((name, time.perf_counter() - wall0,
                         _cpu_s(resource.RUSAGE_SELF) - cpu0, 0.0))

        record: dict[str, Any] = {"data": {"rule": 1}}
        for name, code, kind, isolation in (
                ("parse + child round trip", value, "EXTRACTOR", "process"),
                ("parse + handler child", args.handlers, "HANDLERS", "process"),
                ("parse + handler inline", args.handlers, "HANDLERS", "inline")):
            if not code:
                continue
            extractor = UserExtractor(code, timeout_s=10.0, kind=kind, isolation=isolation)
            warm = extractor.bind(record, response)
            parse_html(body, url, response.content_type, on_tree=warm.on_tree)  # start it
            assert "data_errors" not in record, record
            child_pid = (extractor._local.all[0].process.pid if isolation == "process"
                         else os.getpid())
            if kind == "EXTRACTOR":
                rss_kb, vsz_kb = _status_kb(child_pid, "VmRSS"), _status_kb(child_pid, "VmSize")
            child_cpu0 = _proc_cpu_s(child_pid)
            cpu0, wall0 = _cpu_s(resource.RUSAGE_SELF), time.perf_counter()
            for _ in range(args.pages):
                call = extractor.bind({"data": {"rule": 1}}, response)
                parse_html(body, url, response.content_type, on_tree=call.on_tree)
            wall, cpu = time.perf_counter() - wall0, _cpu_s(resource.RUSAGE_SELF) - cpu0
            busy_rss_kb = _status_kb(child_pid, "VmRSS")
            rows.append((name, wall, cpu, _proc_cpu_s(child_pid) - child_cpu0))
            extractor.close()

    print(f"page: {len(body)} bytes, {body.count(b'<a ')} links; {args.pages} pages each")
    print(f"{'':28} {'wall us/page':>13} {'parent CPU us':>14} {'child CPU us':>13}")
    for name, wall, cpu, child_cpu in rows:
        print(f"{name:28} {wall / args.pages * 1e6:13.0f} {cpu / args.pages * 1e6:14.0f} "
              f"{child_cpu / args.pages * 1e6:13.0f}")
    print(f"child at rest: VmRSS {rss_kb / 1024:.1f} MiB, VmSize {vsz_kb / 1024:.1f} MiB; "
          f"after {args.pages} pages: VmRSS {busy_rss_kb / 1024:.1f} MiB")
    print(f"reply: {record['data']}")


if __name__ == "__main__":
    main()
