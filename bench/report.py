"""The bench's verdicts: every phase's results as table rows against their targets, printed
and written as JSON.

:data:`FIGURES` is the table's row order (tests/test_bench.py checks every one is printed);
the report goes to stdout and to ``bench/out/bench-<time>.json`` (and ``--json FILE``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.capacity import pages_per_gib
from bench.extract_rounds import ratios
from bench.farm import Farm
from bench.figures import Row, judge, render_table
from bench.shared import FLEET_ENV_OVERRIDES, OUT_DIR, REPO_ROOT, Sizes

# Targets from the issue (2-core machine).
TARGET_RATIO = 5.0  # issue 31 (4 in issue 16): at the defaults, alternating rounds, ratio of totals
TARGET_CPU_MS = 1.0  # issue 31: worker CPU a page at the defaults (2.5 before)
TARGET_CPU_RATIO = 5.0  # issue 31: scrapy-redis's CPU a page over the fleet's
TARGET_RSS_MB = 80.0
TARGET_ROUND_TRIPS = 2.0
TARGET_PRODUCER_PER_S = 5000.0
TARGET_SEEN_BYTES = 16.0
TARGET_PRIORITY_P95_S = 2.0
TARGET_POLITE_RATIO = 1.03  # issue 31: >= 0.97 of the limit's pace over a 30 s crawl
TARGET_FILES_SINK_RATIO = 3.0     # files sink rows/s per fleet page/s
TARGET_POSTGRES_SINK_RATIO = 1.0  # PostgreSQL sink rows/s per fleet page/s
TARGET_CRAWLEE_RATIO = 4.0
TARGET_INFO_COST = 0.05  # worker CPU per page at LOG_LEVEL=INFO over WARNING, minus one
TARGET_EXTRACT_RATIO = 2.5  # fleet with rules vs scrapy-redis extracting the same fields

#: Row labels, in table order; tests/test_bench.py checks every one is printed.
FIGURES: tuple[str, ...] = (
    "fleet pages/s",
    "scrapy-redis pages/s",
    "fleet / scrapy-redis",
    "scrapy-redis in-memory scheduler pages/s",
    "fleet / scrapy-redis in-memory scheduler",
    "Crawlee pages/s",
    "fleet / Crawlee",
    "worker CPU per page",
    "scrapy-redis CPU per page",
    "scrapy-redis CPU / fleet CPU per page",
    "worker peak RSS",
    "Redis round trips per page, hot path",
    "Redis round trips per page, all",
    "Redis reads per page (server)",
    "system CPU per page, fleet",
    "system CPU per page, scrapy-redis",
    "producer new URLs/s",
    "seen-set bytes per URL",
    "seen-set false positives",
    "result record bytes p50",
    "result record bytes p99",
    "result record bytes max",
    "pages per GB of Redis",
    "files sink rows/s",
    "PostgreSQL sink rows/s",
    "files sink / fleet pages/s",
    "PostgreSQL sink / fleet pages/s",
    "INFO logging CPU cost",
    "rules pages/s",
    "rules / plain pages/s",
    "rules CPU per page",
    "handlers pages/s",
    "handlers / plain pages/s",
    "handlers CPU per page",
    "handlers inline pages/s",
    "handlers inline / plain pages/s",
    "handlers inline CPU per page",
    "WARC pages/s",
    "WARC / plain pages/s",
    "WARC CPU per page",
    "rules fleet / scrapy-redis extracting",
    "handlers fleet / scrapy-redis extracting",
    "handlers CPU per page / scrapy-redis's",
    "handlers inline fleet / scrapy-redis extracting",
    "handlers inline CPU per page / scrapy-redis's",
    "rules' data equal to the peer's",
    "handlers' data equal to the peer's",
    "scaling: 1 worker pages/s",
    "scaling: 2 workers pages/s",
    "scaling: 4 workers pages/s",
    "priority wait p50",
    "priority wait p95",
    "politeness duration / bound",
    "politeness windows over limit",
    "machine speed: reference parse",
)


def figure_phase(figure: str) -> str:
    """Which phase measures ``figure``."""
    prefixes = (("scrapy-redis in-memory", "peer_memory"),
                ("fleet / scrapy-redis in-memory", "peer_memory"), ("Crawlee", "crawlee"),
                ("fleet / Crawlee", "crawlee"), ("scrapy-redis", "peer"), ("fleet /", "peer"),
                ("system CPU per page, scrapy", "peer"), ("producer", "producer"),
                ("seen-set", "seen"), ("priority", "priority"), ("politeness", "politeness"),
                ("files sink", "sinks"), ("PostgreSQL sink", "sinks"), ("machine", "machine"),
                ("rules", "extract"), ("WARC", "extract"), ("extracted", "extract"),
                ("INFO", "extract"), ("handlers", "extract"), ("scaling", "scaling"))
    for prefix, phase in prefixes:
        if figure.startswith(prefix):
            return phase
    return "fleet"


def round_spread(phase: dict[str, Any]) -> str:
    """``, rounds 0.97–1.04``: the lowest and highest CPU a page of a phase's rounds (the
    merged figure is their pages-weighted mean; the spread is the VM's noise to read it by)."""
    per = [r["cpu_ms_per_page"] for r in phase.get("rounds", ()) if r.get("cpu_ms_per_page")]
    return f", rounds {min(per):.2f}–{max(per):.2f}" if len(per) > 1 else ""


def build_rows(ctx_sizes: Sizes, phases: dict[str, dict[str, Any]]) -> list[Row]:
    fleet, peer = phases.get("fleet", {}), phases.get("peer", {})
    producer, seen = phases.get("producer", {}), phases.get("seen", {})
    prio, polite = phases.get("priority", {}), phases.get("politeness", {})
    workers, spiders = ctx_sizes.workers, ctx_sizes.spiders
    peer_skipped = "skipped" in peer or not peer
    rows: list[Row] = []

    def add(figure: str, value: float | None, unit: str, target: str, verdict: str,
            digits: int = 2) -> None:
        if value is None and verdict != "skipped":
            verdict = "skipped" if figure_phase(figure) not in phases else "FAIL"
        rows.append(Row(figure, value, unit, target, verdict, digits))

    add("fleet pages/s", fleet.get("pages_per_s"), f"pages/s, {workers} workers", "", "info", 0)
    if peer_skipped:
        add("scrapy-redis pages/s", None, f"pages/s, {spiders} spiders", "", "skipped", 0)
        add("fleet / scrapy-redis", None, "x", f">= {TARGET_RATIO:g}", "skipped")
    else:
        ratio = (fleet["pages_per_s"] / peer["pages_per_s"]
                 if peer.get("pages_per_s") and fleet.get("pages_per_s") else None)
        add("scrapy-redis pages/s", peer.get("pages_per_s"), f"pages/s, {spiders} spiders", "",
            "info", 0)
        add("fleet / scrapy-redis", ratio, "x", f">= {TARGET_RATIO:g}",
            judge(ratio, at_least=TARGET_RATIO))
    add_peers(add, fleet, phases, spiders)
    cpu = fleet.get("cpu_ms_per_page")
    add("worker CPU per page", cpu, "ms" + round_spread(fleet), f"<= {TARGET_CPU_MS:g}",
        judge(cpu, at_most=TARGET_CPU_MS))
    # Per unit of CPU, the figure that does not move with the VM's load (issue 31): the
    # spiders' own CPU a page over the workers'.
    peer_cpu = None if peer_skipped else peer.get("cpu_ms_per_page")
    add("scrapy-redis CPU per page", peer_cpu,
        f"ms, {spiders} spider processes" + ("" if peer_skipped else round_spread(peer)), "",
        "skipped" if peer_skipped else "info")
    cheaper = peer_cpu / cpu if peer_cpu and cpu else None
    add("scrapy-redis CPU / fleet CPU per page", cheaper, "x", f">= {TARGET_CPU_RATIO:g}",
        "skipped" if peer_skipped else judge(cheaper, at_least=TARGET_CPU_RATIO))
    rss = fleet.get("rss_mb")
    add("worker peak RSS", rss, "MB", f"<= {TARGET_RSS_MB:g}", judge(rss, at_most=TARGET_RSS_MB), 1)
    hot = fleet.get("hot_round_trips_per_page")
    hot = None if hot is None else round(hot, 2)  # per-domain extras (robots) are < 0.01
    add("Redis round trips per page, hot path", hot, "client-counted, per-page shapes",
        f"<= {TARGET_ROUND_TRIPS:g}", judge(hot, at_most=TARGET_ROUND_TRIPS))
    add("Redis round trips per page, all", fleet.get("round_trips_per_page"),
        "incl. connects, heartbeats, robots", "", "info")
    add("Redis reads per page (server)", fleet.get("redis_reads_per_page"),
        "INFO total_reads_processed", "", "info")
    add("system CPU per page, fleet", fleet.get("system_cpu_ms_per_page"),
        "ms (workers+RabbitMQ+Redis+nginx)", "", "info")
    add("system CPU per page, scrapy-redis",
        None if peer_skipped else peer.get("system_cpu_ms_per_page"),
        "ms (spiders+Redis+nginx)", "", "skipped" if peer_skipped else "info")
    rate = producer.get("new_per_s")
    add("producer new URLs/s", rate, f"URLs/s, {producer.get('urls', 0):,} new, confirmed",
        f">= {TARGET_PRODUCER_PER_S:,.0f}", judge(rate, at_least=TARGET_PRODUCER_PER_S), 0)
    per_url = seen.get("bytes_per_url")
    exact = seen.get("false_positives") == 0 and seen.get("members_missing") == 0
    add("seen-set bytes per URL", per_url, f"bytes at {seen.get('urls', 0):,} URLs",
        f"<= {TARGET_SEEN_BYTES:g}", judge(per_url, at_most=TARGET_SEEN_BYTES))
    add("seen-set false positives", seen.get("false_positives"),
        f"of {seen.get('non_members_checked', 0):,} non-members", "0 (exact)",
        "pass" if exact else "FAIL", 0)
    add_capacity(add, fleet, seen)
    add_sinks(add, fleet, phases)
    add_extract(add, phases.get("extract"))
    scaling = phases.get("scaling") or {}
    for n in (1, 2, 4):
        figures = scaling.get(str(n)) or {}
        services = figures.get("service_cpu_ms_per_page") or {}
        add(f"scaling: {n} worker{'s' if n > 1 else ''} pages/s", figures.get("pages_per_s"),
            f"worker CPU {figures.get('cpu_ms_per_page') or 0:.2f} ms/page; RabbitMQ "
            f"{services.get('rabbitmq') or 0:.2f}, Redis {services.get('redis') or 0:.2f}",
            "", "info" if figures else "skipped", 0)
    add("priority wait p50", prio.get("p50_s"), f"s, behind {prio.get('backlog', 0):,} URLs",
        "", "info", 3)
    p95 = prio.get("p95_s")
    add("priority wait p95", p95, f"s, {prio.get('samples', 0)} samples",
        f"<= {TARGET_PRIORITY_P95_S:g}", judge(p95, at_most=TARGET_PRIORITY_P95_S), 3)
    ratio_polite = polite.get("ratio")
    add("politeness duration / bound", ratio_polite,
        f"x, {ctx_sizes.polite_domains} x {ctx_sizes.polite_urls} pages at "
        f"{ctx_sizes.polite_rate}/s each, {ctx_sizes.polite_workers} workers, 200 ms latency",
        f"<= {TARGET_POLITE_RATIO:g}", judge(ratio_polite, at_most=TARGET_POLITE_RATIO), 3)
    over = polite.get("windows_over")
    add("politeness windows over limit", over, "1 s sliding windows", "0",
        "pass" if over == 0 else "FAIL", 0)
    reference = phases.get("machine", {}).get("reference_parse_us") or []
    add("machine speed: reference parse", sum(reference) / len(reference) if reference else None,
        "us, lxml parse of one farm page, before/after " + "/".join(f"{v:.0f}" for v in reference),
        "", "info", 0)
    return rows


def add_peers(add: Callable[..., None], fleet: dict[str, Any],
              phases: dict[str, dict[str, Any]], spiders: int) -> None:
    """The lighter Scrapy set-up and Crawlee, each on the fleet's URLs in the same rounds."""
    for key, label, unit, target in (
            ("peer_memory", "scrapy-redis in-memory scheduler", f"pages/s, {spiders} spiders",
             None),
            ("crawlee", "Crawlee", "pages/s, 2 processes, half the URLs each",
             TARGET_CRAWLEE_RATIO)):
        peer = phases.get(key) or {}
        skipped = "skipped" in peer or not peer
        why = f"skipped: {peer['skipped']}"[:72] if "skipped" in peer else ""
        rate, ours = peer.get("pages_per_s"), fleet.get("pages_per_s")
        ratio = ours / rate if rate and ours else None
        add(f"{label} pages/s", rate, why or unit, "", "skipped" if skipped else "info", 0)
        if target is None:
            add(f"fleet / {label}", ratio, "x", "", "skipped" if skipped else "info")
        else:
            add(f"fleet / {label}", ratio, "x", f">= {target:g}",
                "skipped" if skipped else judge(ratio, at_least=target))


def add_capacity(add: Callable[..., None], fleet: dict[str, Any], seen: dict[str, Any]) -> None:
    """Result record sizes on the farm and how many pages' outcomes 1 GiB of Redis holds."""
    records = f"bytes of JSON, {fleet.get('records', 0):,} farm pages"
    for pct in ("p50", "p99", "max"):
        add(f"result record bytes {pct}", fleet.get(f"record_bytes_{pct}"), records, "",
            "info", 0)
    stream, per_url = fleet.get("stream_bytes_per_record"), seen.get("bytes_per_url")
    cache = fleet.get("cache_bytes_per_entry")
    unit = (f"1 GiB / ({stream or 0:,.0f} stream + 2 x {per_url or 0:.1f} seen/done B); "
            f"cache {cache or 0:,.0f} B/page for its TTL on top")
    add("pages per GB of Redis", pages_per_gib(stream, per_url), unit, "",
        "info" if seen else "skipped", 0)


def add_sinks(add: Callable[..., None], fleet: dict[str, Any],
              phases: dict[str, dict[str, Any]]) -> None:
    """Each sink's rows/s draining the fleet's records, and as a multiple of its pages/s."""
    sinks = phases.get("sinks")
    pages_per_s = fleet.get("pages_per_s")
    kinds = (("files", "files sink", "entries/s, gzip JSONL, fsync", TARGET_FILES_SINK_RATIO),
             ("postgres", "PostgreSQL sink", "rows/s, upserts, sync commit",
              TARGET_POSTGRES_SINK_RATIO))
    ratios = []
    for key, label, what, target in kinds:
        sink = (sinks or {}).get(key) or {}
        if sinks is None or "skipped" in sink:
            why = f"skipped: {sink['skipped']}"[:72] if "skipped" in sink else ""
            add(f"{label} rows/s", None, why, "", "skipped", 0)
            ratios.append((f"{label} / fleet pages/s", None, "x", f">= {target:g}", "skipped"))
            continue
        rate = sink.get("rows_per_s")
        ratio = rate / pages_per_s if rate and pages_per_s else None
        unit = (f"{what}, {sink.get('entries', 0):,} farm records, "
                f"batches of {sinks.get('sink_batch')}")
        add(f"{label} rows/s", rate, unit, "", "info", 0)
        ratios.append((f"{label} / fleet pages/s", ratio,
                       f"x the fleet's {pages_per_s or 0:,.0f} pages/s", f">= {target:g}",
                       judge(ratio, at_least=target)))
    for figure, ratio, unit, target, verdict in ratios:  # in FIGURES order: rates, then ratios
        add(figure, ratio, unit, target, verdict, 1)


def add_extract(add: Callable[..., None], extract: dict[str, Any] | None) -> None:
    """Extraction rules and the WARC archive against the plain fleet, and the fleet with rules
    against scrapy-redis extracting the same fields (bench/extract_rounds.py)."""
    extract = extract or {}
    ratio = ratios(extract)
    per_round = f"{extract.get('urls_per_round', 0):,} URLs a round"
    cost = ratio["info_cpu_cost"]
    add("INFO logging CPU cost", None if cost is None else 100 * cost,
        "% worker CPU per page, LOG_LEVEL INFO (default) over WARNING",
        f"<= {100 * TARGET_INFO_COST:g}", judge(cost, at_most=TARGET_INFO_COST), 1)
    for variant, label in (("rules", "rules"), ("handlers", "handlers"),
                           ("inline", "handlers inline"), ("warc", "WARC")):
        figures = extract.get(variant) or {}
        why = f"skipped: {figures['skipped']}"[:72] if "skipped" in figures else ""
        verdict = "skipped" if why else "info"
        add(f"{label} pages/s", figures.get("pages_per_s"), why or f"pages/s, {per_round}", "",
            verdict, 0)
        add(f"{label} / plain pages/s", ratio[f"{variant}_rate_ratio"],
            why or "x the plain fleet's pages/s, same rounds", "", verdict)
        cpu = figures.get("cpu_ms_per_page")
        cpu_ratio = ratio[f"{variant}_cpu_ratio"]
        add(f"{label} CPU per page", cpu, why or f"ms, {cpu_ratio or 0:.2f} x plain", "", verdict)
    peer = extract.get("peer") or {}
    skipped = "skipped" in peer or not peer
    add("rules fleet / scrapy-redis extracting", ratio["rules_vs_peer"],
        f"x, scrapy-redis {peer.get('pages_per_s') or 0:,.0f} pages/s with the same fields",
        f">= {TARGET_EXTRACT_RATIO:g}",
        "skipped" if skipped else judge(ratio["rules_vs_peer"], at_least=TARGET_EXTRACT_RATIO))
    handlers_skipped = skipped or "skipped" in (extract.get("handlers") or {"skipped": 1})
    for variant, label, where in (("handlers", "handlers", "in child processes (default)"),
                                  ("inline", "handlers inline", "HANDLER_ISOLATION=inline")):
        gone = skipped or "skipped" in (extract.get(variant) or {"skipped": 1})
        add(f"{label} fleet / scrapy-redis extracting", ratio.get(f"{variant}_vs_peer"),
            f"x, a Python handler with the same fields, {where}",
            f">= {TARGET_EXTRACT_RATIO:g}", "skipped" if gone
            else judge(ratio.get(f"{variant}_vs_peer"), at_least=TARGET_EXTRACT_RATIO))
        add(f"{label} CPU per page / scrapy-redis's", ratio.get(f"{variant}_cpu_vs_peer"),
            "x, scrapy-redis ms per page over the fleet's (worker + children)", "",
            "skipped" if gone else "info")
    for prefix, label in (("data", "rules"), ("handler_data", "handlers")):
        compared, equal = extract.get(f"{prefix}_compared"), extract.get(f"{prefix}_equal")
        add(f"{label}' data equal to the peer's", equal, f"of {compared or 0} sampled URLs",
            "all", "skipped" if skipped or (prefix == "handler_data" and handlers_skipped)
            else ("pass" if compared and equal == compared else "FAIL"), 0)


def _json_default(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN → None, recursively, so the JSON is standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_report(args: argparse.Namespace, sizes: Sizes, phases: dict[str, dict[str, Any]],
                 farm: Farm, stamp: str, started: float) -> None:
    """The table on stdout, the whole report in ``bench/out/bench-<stamp>.json`` (and --json)."""
    rows = build_rows(sizes, phases)
    table = render_table(rows)
    elapsed_s = time.monotonic() - started
    report = {
        "started_utc": stamp,
        "elapsed_s": round(elapsed_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "sizes": sizes.__dict__,
        "fleet_env_overrides": FLEET_ENV_OVERRIDES,
        "farm": {"sites": sizes.sites, "pages": sizes.pages,
                 "mean_page_bytes": farm.page_bytes_mean},
        "rows": [row.as_dict() for row in rows],
        "phases": phases,
        "table": table,
    }
    text = json.dumps(_clean(report), indent=2, default=_json_default)
    out = OUT_DIR / f"bench-{stamp}.json"
    out.write_text(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    print(f"\n== bench: {sizes.sites} sites x {sizes.pages} pages, {sizes.workers} workers vs "
          f"{sizes.spiders} spiders, {elapsed_s:.0f}s ({out.relative_to(REPO_ROOT)}) ==")
    print(table, flush=True)
    profile = phases.get("fleet", {}).get("profile")
    if profile and profile.get("samples"):
        print("\nworker profile (py-spy, share of samples, self):")
        for name, share in profile["self"][:10]:
            print(f"  {share:5.1f}%  {name}")
