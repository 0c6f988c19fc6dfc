"""The extract phase: what extraction rules, the WARC archive and INFO logging cost, and the
fleet with rules against scrapy-redis doing the same extraction.

On a slice of the farm's URLs, in alternating rounds so load from elsewhere falls on all alike:

* ``plain``  — the fleet as in the fleet phase (every feature on, default settings: LOG_LEVEL
  INFO writes a line per URL);
* ``quiet``  — the same at LOG_LEVEL=WARNING, so the plain row's logging cost shows;
* ``rules``  — the same with :data:`FARM_RULES` (five fields and one list of items, the shape of
  a typical product or article rule file);
* ``handlers`` — the same with ``HANDLERS=bench.farm_handlers:router``: a Python handler
  extracting the same fields (the peers' own extraction code) in the user-code child;
* ``inline`` — the handler variant with ``HANDLER_ISOLATION=inline`` (on the worker's tree);
* ``warc``   — the same with ``ARCHIVE=warc`` (every response written to WARC files) and no
  rules, so its row is the archive's own cost;
* ``peer``   — the scrapy-redis spiders with ``--extract``: the same fields read with Scrapy's
  selectors in the spider (bench/peer_fields.py's ``farm_data``).

Each variant's rounds merge as the fleet phase's do (pages over seconds, CPU over pages). The
rules round's ``data`` is compared with the peer's for a sample of URLs, so the two crawlers
are shown to extract the same values.
"""

from __future__ import annotations

import json
from typing import Any

from bench.crawl_rounds import merge_rounds, peer_unavailable, phase_fleet, phase_peer
from bench.shared import Ctx, log
from common.core.knobs import KNOBS

FARM_RULES = r"""
rules:
  - name: farm page
    path: '^/p/\d+\.html$'
    fields:
      heading: h1
      lang: {xpath: /html/@lang}
      page: {css: 'meta[name=description]', get: 'attr:content', type: int,
             regex: 'Page (\d+) of'}
      site: {css: 'meta[name=description]', get: 'attr:content', type: int,
             regex: 'farm site (\d+)'}
      canonical: {css: 'link[rel=canonical]', get: 'attr:href', type: url}
    items:
      name: sections
      selector: nav.n li
      fields:
        label: a
        href: {css: a, get: 'attr:href', type: url}
"""

SAMPLE = 200  # URLs whose data is compared between the fleet and the peer
VARIANTS = ("plain", "quiet", "rules", "handlers", "inline", "warc")


def archive_supported() -> bool:
    return any(knob.env == "ARCHIVE" for knob in KNOBS)


def phase_extract(ctx: Ctx) -> dict[str, Any]:
    urls = ctx.farm.urls()
    rounds = 1 if ctx.args.small else 2
    share = 1 if ctx.args.small else 4  # each round crawls 1/share of the farm per variant
    rules_path = ctx.work / "farm-rules.yml"
    rules_path.write_text(FARM_RULES)
    envs = {"plain": {}, "quiet": {"LOG_LEVEL": "WARNING"},
            "rules": {"EXTRACT_RULES": f"@{rules_path}"},
            "handlers": {"HANDLERS": "bench.farm_handlers:router"},
            "inline": {"HANDLERS": "bench.farm_handlers:router", "HANDLER_ISOLATION": "inline"},
            "warc": {"ARCHIVE": "warc", "ARCHIVE_DIR": str(ctx.work / "warc")}}
    skipped = {"warc": None if archive_supported() else "ARCHIVE is not a setting yet",
               "handlers": None if _knob("HANDLERS") else "HANDLERS is not a setting yet",
               "inline": None if _knob("HANDLER_ISOLATION") else "no HANDLER_ISOLATION yet"}
    peer_skipped = peer_unavailable(ctx)
    by_variant: dict[str, list[dict[str, Any]]] = {v: [] for v in (*VARIANTS, "peer")}
    fleet_data: dict[str, Any] = {}
    handler_data: dict[str, Any] = {}
    peer_data: dict[str, Any] = {}
    for r in range(rounds):
        chunk = urls[r::rounds * share]
        for variant in VARIANTS:
            if skipped.get(variant):
                continue
            result = phase_fleet(ctx, chunk, f"x{r + 1}-{variant}", extra_env=envs[variant])
            by_variant[variant].append(result)
            log(f"extract round {r + 1}/{rounds} {variant}: "
                f"{result['pages_per_s']:.0f} pages/s, {result['cpu_ms_per_page']:.2f} ms/page")
            if variant == "rules" and not fleet_data:
                fleet_data = _fleet_sample(ctx)
            if variant == "handlers" and not handler_data:
                handler_data = _fleet_sample(ctx)
        if peer_skipped is None:
            result = phase_peer(ctx, chunk, f"x{r + 1}", extract=True)
            by_variant["peer"].append(result)
            log(f"extract round {r + 1}/{rounds} peer: {result['pages_per_s']:.0f} pages/s")
            if not peer_data:
                peer_data = _peer_sample(ctx, set(fleet_data))
    out: dict[str, Any] = {"rules": FARM_RULES.strip(),
                           "urls_per_round": len(urls[::rounds * share])}
    for variant, results in by_variant.items():
        cpu_key = "spider_cpu_s" if variant == "peer" else "worker_cpu_s"
        if results:
            merged = merge_rounds(results, cpu_key)
            out[variant] = {k: merged[k] for k in ("pages_per_s", "cpu_ms_per_page",
                                                   "system_cpu_ms_per_page", "pages_logged")}
            if variant == "handlers":  # the user-code children's CPU is in the workers'
                out[variant]["cpu_includes"] = "worker and its user-code children (wait4)"
            if "rss_mb" in merged:
                out[variant]["rss_mb"] = merged["rss_mb"]
        else:
            out[variant] = {"skipped": peer_skipped if variant == "peer"
                            else skipped.get(variant) or "not run"}
    compared = [url for url in fleet_data if url in peer_data]
    out["data_compared"] = len(compared)
    out["data_equal"] = sum(1 for url in compared if fleet_data[url] == peer_data[url])
    out["data_differences"] = [{"url": url, "fleet": fleet_data[url], "peer": peer_data[url]}
                               for url in compared if fleet_data[url] != peer_data[url]][:3]
    handled = [url for url in handler_data if url in peer_data]
    out["handler_data_compared"] = len(handled)
    out["handler_data_equal"] = sum(1 for url in handled if handler_data[url] == peer_data[url])
    return out


def _knob(env: str) -> bool:
    return any(knob.env == env for knob in KNOBS)


def _fleet_sample(ctx: Ctx) -> dict[str, Any]:
    client = ctx.redis()
    try:
        entries = client.xrange("results", count=SAMPLE)
    finally:
        client.close()
    records = [json.loads(fields[b"json"]) for _id, fields in entries]
    return {r["url"]: r["items"][0] if r.get("items") else r.get("data")
            for r in records if r.get("status") == 200}


def _peer_sample(ctx: Ctx, wanted: set[str]) -> dict[str, Any]:
    client = ctx.redis(1)
    try:
        items = [json.loads(raw) for raw in client.lrange("peer:items", 0, -1)]
    finally:
        client.close()
    return {item["url"]: item.get("data") for item in items if item["url"] in wanted}


def ratios(extract: dict[str, Any]) -> dict[str, float | None]:
    """pages/s and CPU per page of each variant relative to plain, and rules vs the peer."""
    def value(variant: str, key: str) -> float | None:
        figure = extract.get(variant, {}).get(key)
        return figure if isinstance(figure, int | float) and figure else None

    out: dict[str, float | None] = {}
    plain_rate, plain_cpu = value("plain", "pages_per_s"), value("plain", "cpu_ms_per_page")
    for variant in ("rules", "handlers", "inline", "warc"):
        rate, cpu = value(variant, "pages_per_s"), value(variant, "cpu_ms_per_page")
        out[f"{variant}_rate_ratio"] = rate / plain_rate if rate and plain_rate else None
        out[f"{variant}_cpu_ratio"] = cpu / plain_cpu if cpu and plain_cpu else None
    quiet_cpu = value("quiet", "cpu_ms_per_page")
    out["info_cpu_cost"] = plain_cpu / quiet_cpu - 1 if plain_cpu and quiet_cpu else None
    rules_rate, peer_rate = value("rules", "pages_per_s"), value("peer", "pages_per_s")
    out["rules_vs_peer"] = rules_rate / peer_rate if rules_rate and peer_rate else None
    peer_cpu = value("peer", "cpu_ms_per_page")
    for variant in ("handlers", "inline"):
        rate, cpu = value(variant, "pages_per_s"), value(variant, "cpu_ms_per_page")
        out[f"{variant}_vs_peer"] = rate / peer_rate if rate and peer_rate else None
        out[f"{variant}_cpu_vs_peer"] = peer_cpu / cpu if cpu and peer_cpu else None
    return out
