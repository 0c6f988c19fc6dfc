"""What rendering costs: pages/s per core, CPU per page and memory per concurrent page of
``worker.py --render``, against Crawlee's PlaywrightCrawler on the same pages (issue 29).

    .venv/bin/python -m bench.render_cost [--pages 2000] [--sites 4] [--workers 2]
        [--threads 1] [--skip-peer] [--bench-python bench/.venv/bin/python] [--json]

The farm: ``--pages`` JavaScript shells spread over ``--sites`` loopback sites served by nginx
(bench/farm.py's server and log). Page ``/r/N.html`` is an empty ``<div id=app>`` and a script
that fetches its data ``/d/N.json`` (same-site XHR) and writes the heading, the price, ten
list items, six paragraphs and twenty links; nothing is visible without a browser.

The fleet: RabbitMQ and Redis (devtools.services, as the other bench modules start them),
``producer.py`` seeds every page, one HTTP worker routes them (an EXTRACT_RULES rule with
``render: {wait_for: span.price}``) and ``--workers`` ``worker.py --render`` processes
(RENDER_THREADS=``--threads``, so 2 x threads pages at once each) render and extract them.
The peer (unless ``--skip-peer``): bench/peers/render_crawlee.py in the bench venv, one
process per render worker, each given its share of the URLs and the same pages at once, on
the same Chromium (/usr/bin/chromium), extracting the same fields.

Measured from the kernel, for each process with all its descendants (Playwright's driver and
every Chromium process): CPU (utime + stime per process, sampled every second, and the
reaped total from wait4; the larger is reported), total PSS and RSS every second (peak, and the
medians of the first and last quarter of the crawl: flat memory), Chromium processes left
once the workers have exited (by pid and by Chromium's process groups). Pages/s from nginx's
log (first to last page request); one result per URL and the fields checked against the farm.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.crawl_rounds import machine_busy_s  # noqa: E402
from bench.farm import FIRST_HOST, Farm, LogLine, NginxFarm, _free_port_on_all  # noqa: E402
from bench.farm_pages import Site, paragraph_pool  # noqa: E402
from bench.procstat import Proc, read_procs  # noqa: E402
from bench.shared import REPO_ROOT, fleet_env, log, queue_depths, run_producer  # noqa: E402
from common.broker import topology  # noqa: E402
from devtools.services import fleet_services, reset_state  # noqa: E402

ITEMS_PER_PAGE = 10
PEER_SCRIPT = "bench.peers.render_crawlee"
#: The rule that sends the farm's pages to the render workers, and what it extracts.
RULES = {"rules": [{
    "name": "render-farm", "path": r"^/r/\d+\.html$", "render": {"wait_for": "span.price"},
    "fields": {"name": "h1.name", "price": {"css": "span.price", "type": "float"},
               "items": {"css": "li.item", "many": True}}}]}

_SHELL = """<!DOCTYPE html><html><head><meta charset=utf-8><title>render {s}-{n}</title></head>
<body><div id=app>Loading...</div><script>
fetch('/d/{n}.json').then(function (r) {{ return r.json(); }}).then(function (d) {{
  var html = '<h1 class=name>' + d.name + '</h1><span class=price>' + d.price.toFixed(2) +
    '</span><ul>' + d.items.map(function (i) {{ return '<li class=item>' + i + '</li>'; }})
    .join('') + '</ul>' + d.text.map(function (p) {{ return '<p>' + p + '</p>'; }}).join('') +
    '<nav>' + d.links.map(function (l) {{ return '<a href="' + l + '">' + l + '</a>'; }})
    .join(' ') + '</nav>';
  document.getElementById('app').innerHTML = html;
}});
</script></body></html>
"""


# -- the farm ---------------------------------------------------------------------------------

def expected_fields(site: int, n: int) -> dict[str, Any]:
    """What the rule (and the peer) must extract from page ``n`` of site ``site``."""
    return {"name": f"product {site}-{n}", "price": round(n + 0.5, 2),
            "items": [f"item {site}-{n}-{k}" for k in range(ITEMS_PER_PAGE)]}


def page_data(site: int, n: int, pages: int, pool: Sequence[str]) -> dict[str, Any]:
    """The JSON of /d/N.json: the fields, six paragraphs of text and twenty links."""
    text = [pool[(site * 7919 + n * 31 + k) % len(pool)] for k in range(6)]
    links = [f"/r/{(n * 13 + k * 101) % pages + 1}.html" for k in range(20)]
    return {**expected_fields(site, n), "text": text, "links": links}


def write_render_farm(root: Path, *, sites: int, pages: int) -> Farm:
    """``pages`` shells spread over ``sites`` sites, their JSON, robots.txt and nginx.conf."""
    per_site = -(-pages // sites)
    hosts = [str(FIRST_HOST + i) for i in range(sites)]
    port = _free_port_on_all(hosts)
    farm_sites = [Site(i, host, port) for i, host in enumerate(hosts)]
    pool = paragraph_pool()
    total = 0
    for site in farm_sites:
        base = root / f"site{site.index}"
        (base / "r").mkdir(parents=True, exist_ok=True)
        (base / "d").mkdir(exist_ok=True)
        for n in range(1, per_site + 1):
            shell = _SHELL.format(s=site.index, n=n).encode()
            data = json.dumps(page_data(site.index, n, per_site, pool)).encode()
            (base / "r" / f"{n}.html").write_bytes(shell)
            (base / "d" / f"{n}.json").write_bytes(data)
            total += len(shell) + len(data)
        (base / "robots.txt").write_text("User-agent: *\nAllow: /\n")
    farm = Farm(root, farm_sites, per_site, total // (sites * per_site))
    farm._write_nginx_conf()
    conf = farm.conf_path.read_text()
    farm.conf_path.write_text(conf.replace(
        "types { text/html html;", "types { application/json json; text/html html;"))
    return farm


def render_urls(farm: Farm, pages: int) -> list[str]:
    """The first ``pages`` shell URLs, sites interleaved."""
    urls = [f"{site.base_url}/r/{n}.html" for n in range(1, farm.pages + 1)
            for site in farm.sites]
    return urls[:pages]


def site_and_page(url: str, farm: Farm) -> tuple[int, int]:
    host = url.split("//", 1)[1].split(":", 1)[0]
    index = next(site.index for site in farm.sites if site.host == host)
    return index, int(url.rsplit("/", 1)[1].split(".", 1)[0])


# -- process trees ----------------------------------------------------------------------------

def tree(root: int, procs: Mapping[int, Proc]) -> list[Proc]:
    """``root`` and its live descendants."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in procs:
            out.append(procs[pid])
            todo += children.get(pid, [])
    return out


def memory_kb(pid: int) -> tuple[int, int]:
    """(PSS, RSS) of ``pid`` in KiB, 0s when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0, 0
    values = {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines()[1:]
              if line.startswith(("Pss:", "Rss:"))}
    return values.get("Pss", 0), values.get("Rss", 0)


def quarter_medians(values: Sequence[float]) -> tuple[float, float]:
    """Medians of the first and the last quarter of ``values`` (at least one value each)."""
    if not values:
        raise ValueError("no samples")
    q = max(1, len(values) // 4)
    return statistics.median(values[:q]), statistics.median(values[-q:])


@dataclass
class TreeWatch:
    """One child process whose whole tree is sampled every ``interval_s``."""

    proc: subprocess.Popen[bytes]
    name: str
    cpu_by_proc: dict[tuple[int, int], tuple[str, float]] = field(default_factory=dict)
    memory: list[tuple[float, int, int]] = field(default_factory=list)  # time, PSS, RSS KiB
    chromium: set[tuple[int, int]] = field(default_factory=set)  # (pid, start)
    chromium_groups: set[int] = field(default_factory=set)
    wait4_cpu_s: float | None = None
    returncode: int | None = None

    def sample(self, procs: Mapping[int, Proc], now: float) -> None:
        pss = rss = 0
        for proc in tree(self.proc.pid, procs):
            self.cpu_by_proc[(proc.pid, proc.start)] = (proc.comm, proc.cpu_s)
            p, r = memory_kb(proc.pid)
            pss, rss = pss + p, rss + r
            if "chrom" in proc.comm.lower():
                self.chromium.add((proc.pid, proc.start))
                self.chromium_groups.add(proc.pgid)
        if pss:
            self.memory.append((now, pss, rss))

    @property
    def sampled_cpu_s(self) -> float:
        return sum(cpu for _comm, cpu in self.cpu_by_proc.values())

    @property
    def cpu_s(self) -> float:
        return max(self.sampled_cpu_s, self.wait4_cpu_s or 0.0)

    def cpu_by_kind(self) -> dict[str, float]:
        """Sampled CPU seconds by process kind: the Python worker, Playwright's node driver,
        Chromium's processes."""
        kinds: Counter[str] = Counter()
        for comm, cpu in self.cpu_by_proc.values():
            kind = ("chromium" if "chrom" in comm.lower() else
                    "node" if comm.startswith("node") else comm)
            kinds[kind] += cpu
        return {kind: round(cpu, 1) for kind, cpu in kinds.most_common()}


class Sampler:
    """Samples the trees of some children every ``interval_s`` in a thread."""

    def __init__(self, watches: Sequence[TreeWatch], interval_s: float = 1.0):
        self.watches, self.interval_s = list(watches), interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            procs, now = read_procs(), time.time()
            for watch in self.watches:
                if watch.returncode is None:
                    watch.sample(procs, now)
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


#: Set in every measured process's environment, which Chromium's processes inherit: Chromium's
#: crash handlers leave the tree at once (double fork, own session), so only this finds them.
TAG_ENV = "BENCH_RENDER_TAG"


def start(cmd: Sequence[str], name: str, env: Mapping[str, str], log_path: Path) -> TreeWatch:
    with log_path.open("wb") as out:
        proc = subprocess.Popen(list(cmd), cwd=REPO_ROOT,
                                env=dict(env, **{TAG_ENV: f"{os.getpid()}-{name}"}),
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    return TreeWatch(proc, name)


def reap(watches: Sequence[TreeWatch], timeout_s: float) -> None:
    """wait4 every child (its reaped descendants' CPU included); SIGTERM past the timeout."""
    deadline = time.monotonic() + timeout_s
    for watch in watches:
        while watch.returncode is None:
            pid, status, usage = os.wait4(watch.proc.pid, os.WNOHANG)
            if pid == watch.proc.pid:
                watch.wait4_cpu_s = usage.ru_utime + usage.ru_stime
                watch.returncode = os.waitstatus_to_exitcode(status)
                watch.proc.returncode = watch.returncode
                break
            if time.monotonic() > deadline:
                log(f"{watch.name} still running after {timeout_s:.0f} s: SIGTERM")
                watch.proc.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 30
            time.sleep(0.2)


def has_tag(pid: int, tags: set[bytes]) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(entry in tags for entry in environ)


def leftover_chromium(watches: Sequence[TreeWatch]) -> list[str]:
    """Chromium processes of these trees still alive ("pid comm parent=ppid" each): by
    (pid, start) seen, in a group a Chromium of theirs led, or with their :data:`TAG_ENV`
    (crash handlers included)."""
    procs = read_procs()
    seen = set().union(*(w.chromium for w in watches))
    groups = set().union(*(w.chromium_groups for w in watches))
    tags = {f"{TAG_ENV}={os.getpid()}-{w.name}".encode() for w in watches}
    return [f"{p.pid} {p.comm} parent={p.ppid}" for p in procs.values()
            if "chrom" in p.comm.lower() and ((p.pid, p.start) in seen or p.pgid in groups
                                              or has_tag(p.pid, tags))]


def leftover_figures(watches: Sequence[TreeWatch], grace_s: float = 10.0) -> dict[str, Any]:
    """Chromium left the moment the last process was reaped, and how long until none (a
    browser whose driver exited is still shutting down for a moment), up to ``grace_s``."""
    started = time.monotonic()
    at_exit = left = leftover_chromium(watches)
    while left and time.monotonic() - started < grace_s:
        time.sleep(0.2)
        left = leftover_chromium(watches)
    return {"leftover_chromium_at_exit": len(at_exit), "leftover_examples": at_exit[:4],
            "leftover_chromium": len(left),
            "leftover_gone_after_s": round(time.monotonic() - started, 1) if not left else None}


# -- figures ----------------------------------------------------------------------------------

def memory_figures(watch: TreeWatch, since: float, until: float, at_once: int) -> dict[str, Any]:
    """Peak PSS/RSS of the tree (MiB), per page at once, and the first/last quarter medians
    of its PSS during the crawl window."""
    window = [m for m in watch.memory if since <= m[0] <= until] or watch.memory
    peak_pss = max(m[1] for m in watch.memory) / 1024
    peak_rss = max(m[2] for m in watch.memory) / 1024
    first, last = quarter_medians([m[1] / 1024 for m in window])
    return {"peak_pss_mb": round(peak_pss), "peak_rss_mb": round(peak_rss),
            "peak_pss_mb_per_page_at_once": round(peak_pss / at_once),
            "peak_rss_mb_per_page_at_once": round(peak_rss / at_once),
            "pss_median_first_quarter_mb": round(first), "pss_median_last_quarter_mb": round(last),
            "pss_last_vs_first": round(last / first, 3), "samples": len(window),
            "pss_median_by_tenth_mb": tenths([m[1] / 1024 for m in window])}


def tenths(values: Sequence[float]) -> list[int]:
    """The median of each tenth of ``values`` (fewer when there are fewer values): the shape
    of the memory over the crawl."""
    size = max(1, len(values) // 10)
    return [round(statistics.median(values[i:i + size]))
            for i in range(0, size * min(10, len(values)), size)]


def crawl_figures(name: str, pages: Sequence[LogLine], data_requests: int, renderers:
                  Sequence[TreeWatch], at_once: int, busy_s: float,
                  run_s: float) -> dict[str, Any]:
    """Pages/s, CPU per page, pages per CPU-second and memory of one crawl; ``busy_s``: the
    machine's busy CPU over the ``run_s`` the processes ran (for what else ran meanwhile)."""
    times = [p.time_s for p in pages]
    span_s = max(times) - min(times) if len(times) > 1 else 0.0
    cpu_s = sum(w.cpu_s for w in renderers)
    n = len(pages)
    return {
        "crawler": name, "pages_logged": n,
        "pages_ok": sum(1 for p in pages if p.status == 200),
        "duplicate_page_requests": n - len({(p.addr, p.uri) for p in pages}),
        "data_requests": data_requests, "span_s": round(span_s, 1),
        "pages_per_s": round(n / span_s, 2) if span_s else None,
        "render_cpu_s": round(cpu_s, 1), "cpu_ms_per_page": round(cpu_s / n * 1000) if n else None,
        "pages_per_cpu_s": round(n / cpu_s, 2) if cpu_s else None,
        "cores_used": round(cpu_s / span_s, 2) if span_s else None,
        "run_s": round(run_s, 1),
        "other_cores": round(max(0.0, busy_s - cpu_s) / run_s, 2) if run_s else None,
        "pages_at_once_per_process": at_once,
        "processes": {w.name: {"cpu_s": round(w.cpu_s, 1),
                               "wait4_cpu_s": round(w.wait4_cpu_s or 0.0, 1),
                               "sampled_cpu_s": round(w.sampled_cpu_s, 1),
                               "sampled_cpu_s_by_kind": w.cpu_by_kind(),
                               "chromium_processes_seen": len(w.chromium),
                               "exit": w.returncode,
                               **memory_figures(w, min(times), max(times), at_once)}
                      for w in renderers},
    }


def split_log(lines: Sequence[LogLine]) -> tuple[list[LogLine], int]:
    pages = [line for line in lines if line.uri.startswith("/r/")]
    return pages, sum(1 for line in lines if line.uri.startswith("/d/"))


def check_records(records: Sequence[Mapping[str, Any]], urls: Sequence[str],
                  farm: Farm) -> dict[str, Any]:
    """One result per URL, each rendered, with the farm's fields."""
    per_url = Counter(r["url"] for r in records)
    wrong = [r["url"] for r in records
             if r.get("data") != expected_fields(*site_and_page(r["url"], farm))]
    return {"results": len(records), "urls_with_result": len(set(per_url) & set(urls)),
            "urls_with_several": sum(1 for c in per_url.values() if c > 1),
            "rendered": sum(1 for r in records if r.get("rendered")),
            "wrong_fields": len(wrong), "wrong_example": wrong[:3]}


# -- the runs ---------------------------------------------------------------------------------

def run_fleet(services: Any, server: NginxFarm, farm: Farm, urls: Sequence[str], work: Path,
              args: argparse.Namespace) -> dict[str, Any]:
    """Seed the URLs, then one HTTP worker and ``args.workers`` render workers to the end."""
    reset_state(services.rabbitmq_url, services.redis_url, all_databases=True)
    env = fleet_env(services, 8, EXTRACT_RULES=json.dumps(RULES), LOG_LEVEL="WARNING",
                    RENDER_THREADS=str(args.threads))
    urls_file = work / "render-urls.txt"
    urls_file.write_text("\n".join(urls) + "\n")
    seeded, seed_s = run_producer(env, urls_file)
    log(f"fleet: {seeded.get('new')} URLs seeded in {seed_s:.1f}s; 1 HTTP worker, "
        f"{args.workers} render workers x {2 * args.threads} pages at once")
    offset, busy_before, started = server.log_offset(), machine_busy_s(), time.monotonic()
    py = str(REPO_ROOT / ".venv" / "bin" / "python")
    http = start([py, "worker.py", "--idle-exit", str(args.idle_exit_s)], "http",
                 dict(env, WORKER_ID="http"), work / "worker-http.log")
    renderers = [start([py, "worker.py", "--render", "--idle-exit", str(args.idle_exit_s)],
                       f"render-{i}", dict(env, WORKER_ID=f"render-{i}"),
                       work / f"worker-render-{i}.log") for i in range(args.workers)]
    sampler = Sampler([http, *renderers])
    reap([http, *renderers], timeout_s=60 + 3.0 * len(urls))
    sampler.stop()
    busy_s, run_s = machine_busy_s() - busy_before, time.monotonic() - started
    leftover = leftover_figures(renderers)
    pages, data_requests = split_log(server.read_log(offset))
    if not pages:
        raise RuntimeError(f"fleet: nginx logged no page; see the logs in {work}")
    client = redis.Redis.from_url(services.redis_url)
    records = [json.loads(f[b"json"]) for _id, f in client.xrange("results")]
    client.close()
    depths = queue_depths(services, [*topology.RENDER_QUEUES, topology.FAILED_QUEUE])
    figures = crawl_figures("fleet", pages, data_requests, renderers, 2 * args.threads,
                            busy_s, run_s)
    figures.update(check_records(records, urls, farm), **leftover, queues_left=depths, http_worker_cpu_s=round(http.cpu_s, 1),
                   exits={w.name: w.returncode for w in [http, *renderers]})
    return figures


def run_peer(server: NginxFarm, farm: Farm, urls: Sequence[str], work: Path,
             args: argparse.Namespace, incognito: bool = False) -> dict[str, Any]:
    """The Crawlee peer: one process per render worker, each its share of the URLs;
    ``incognito``: a fresh context per page, as the fleet."""
    tag = "-incognito" if incognito else ""
    offset, busy_before, started = server.log_offset(), machine_busy_s(), time.monotonic()
    watches = []
    for i in range(args.workers):
        share = work / f"peer{tag}-urls-{i}.txt"
        share.write_text("\n".join(urls[i::args.workers]) + "\n")
        storage = work / f"crawlee{tag}-storage-{i}"
        env = dict(os.environ, CRAWLEE_STORAGE_DIR=str(storage), PYTHONUNBUFFERED="1",
                   PYTHONPATH=str(REPO_ROOT))
        watches.append(start([args.bench_python, "-m", PEER_SCRIPT, "--urls", str(share),
                              "--out", str(work / f"peer{tag}-records-{i}.jsonl"),
                              "--concurrency", str(2 * args.threads),
                              *(["--incognito"] if incognito else [])],
                             f"crawlee{tag}-{i}", env, work / f"peer{tag}-{i}.log"))
    sampler = Sampler(watches)
    reap(watches, timeout_s=60 + 3.0 * len(urls))
    sampler.stop()
    busy_s, run_s = machine_busy_s() - busy_before, time.monotonic() - started
    leftover = leftover_figures(watches)
    pages, data_requests = split_log(server.read_log(offset))
    if not pages:
        tail = (work / f"peer{tag}-0.log").read_text(errors="replace")[-3000:]
        raise RuntimeError(f"peer: nginx logged no page; its log ends:\n{tail}")
    records = []
    for i in range(args.workers):
        path = work / f"peer{tag}-records-{i}.jsonl"
        if path.exists():
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
    figures = crawl_figures(f"crawlee-playwright{tag}", pages, data_requests, watches,
                            2 * args.threads, busy_s, run_s)
    figures.update(check_records(records, urls, farm), **leftover, exits={w.name: w.returncode for w in watches})
    return figures


def measure(args: argparse.Namespace) -> dict[str, Any]:
    loads = [Path("/proc/loadavg").read_text().split()[:3]]
    with tempfile.TemporaryDirectory(prefix="render-cost-") as tmp:
        work = Path(tmp)
        farm = write_render_farm(work / "farm", sites=args.sites, pages=args.pages)
        urls = render_urls(farm, args.pages)
        figures: dict[str, Any] = {"pages": len(urls), "sites": args.sites,
                                   "render_workers": args.workers, "render_threads": args.threads,
                                   "page_bytes_mean": farm.page_bytes_mean}
        with fleet_services() as services, NginxFarm(farm) as server:
            try:
                figures["fleet"] = run_fleet(services, server, farm, urls, work, args)
                loads.append(Path("/proc/loadavg").read_text().split()[:3])
                if not args.skip_peer:
                    figures["peer"] = run_peer(server, farm, urls, work, args)
                    loads.append(Path("/proc/loadavg").read_text().split()[:3])
                if args.peer_incognito:
                    figures["peer_incognito"] = run_peer(server, farm, urls, work, args, True)
                    loads.append(Path("/proc/loadavg").read_text().split()[:3])
            finally:
                if args.keep:
                    kept = Path(tempfile.mkdtemp(prefix="render-cost-kept-"))
                    for path in work.glob("*.log"):
                        (kept / path.name).write_bytes(path.read_bytes())
                    log(f"logs kept in {kept}")
        figures["loadavg"] = loads
    return figures


def summary(figures: Mapping[str, Any]) -> list[str]:
    lines = []
    for key in ("fleet", "peer", "peer_incognito"):
        row = figures.get(key)
        if not row:
            continue
        lines.append(
            f"{row['crawler']}: {row['pages_logged']} pages in {row['span_s']} s = "
            f"{row['pages_per_s']} pages/s; {row['cpu_ms_per_page']} CPU-ms/page = "
            f"{row['pages_per_cpu_s']} pages/s per core; results {row['results']} "
            f"({row['urls_with_several']} URLs with several, {row['wrong_fields']} wrong); "
            f"Chromium left {row['leftover_chromium_at_exit']} at exit, "
            f"{row['leftover_chromium']} after {row['leftover_gone_after_s'] or 10} s")
        for name, proc in row["processes"].items():
            lines.append(
                f"  {name}: CPU {proc['cpu_s']} s, peak PSS {proc['peak_pss_mb']} MB / RSS "
                f"{proc['peak_rss_mb']} MB ({proc['peak_pss_mb_per_page_at_once']} / "
                f"{proc['peak_rss_mb_per_page_at_once']} MB per page at once), PSS median "
                f"first/last quarter {proc['pss_median_first_quarter_mb']}/"
                f"{proc['pss_median_last_quarter_mb']} MB")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="render workers")
    parser.add_argument("--threads", type=int, default=1, help="RENDER_THREADS")
    parser.add_argument("--idle-exit-s", type=int, default=10)
    parser.add_argument("--skip-peer", action="store_true")
    parser.add_argument("--peer-incognito", action="store_true",
                        help="also run the peer with a fresh context per page, as the fleet")
    parser.add_argument("--bench-python", default=str(REPO_ROOT / "bench" / ".venv" / "bin"
                                                      / "python"))
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    figures = measure(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print("\n".join(summary(figures)))
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
