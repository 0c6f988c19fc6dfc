"""The status snapshot as text: the table ``stats.py`` prints and the ``--watch`` view, fitted to
the terminal (top rows of domains and workers with ``+N more``, long lines cut).

``stats.py --json`` prints the snapshot itself (common/ops/stats.py ``collect``); its keys:

- ``progress``: ``done`` (URLs with a result), ``failed`` (with a dead letter), ``to_do``
  (pending), ``other`` (known, neither: expired, dropped), ``total`` (their sum),
  ``percent`` (done of total), ``outcomes_per_s``, ``pages_per_s``, ``rate_over_s``,
  ``rate_from`` (``window`` or ``counters``), ``eta_s`` (null when stalled), ``state``
  (``running``, ``stalled``, ``done``, ``idle``): common/ops/crawl_progress.py;
- ``to_do``: where the pending URLs wait: ``ready``, ``delayed``, ``deferred``,
  ``in_flight``, ``total`` (= ``progress.to_do``), and ``in_flight_reported`` (what the
  management API or the heartbeats last said, before the cap: common/ops/status_counts.py);
- ``results`` (results ever recorded) and ``results_detail``: ``recorded``, ``in_stream``,
  ``source`` (``sinks`` or ``stream``), ``sinks``: name -> ``written``, ``waiting``;
- ``dead_letters``: ``now``, ``now_by_reason`` (of the first ``by_reason_of`` browsed),
  ``ever``, ``ever_by_reason``; ``dead_lettered`` (= ``dead_letters.now``) and
  ``dead_lettered_by_reason`` (= ``ever_by_reason``) as before;
- ``queues`` (name -> ``ready``, ``consumers``, ``unacked``, ``publish_rate``,
  ``deliver_rate``; null without the management API), ``delayed``, ``seen``,
  ``pages_per_s_last_minute``, ``expired``, ``expired_waiting``, ``cache``,
  ``robots_blocked``, ``rate_limited``, ``retries``, ``user_code_stopped``, ``domains``,
  ``throttled``, ``deferred``, ``workers``, ``pressure``, ``counters``;
- ``jobs``: one object per job (common/jobs/progress.py ``RunProgress``): ``name``,
  ``state``, ``run``, ``known``, ``done``, ``results``, ``failed``, ``failed_by_reason``,
  ``cancelled``, ``expired``, ``pages_per_s`` (null until measured), ``eta_s``, ....
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from rich.console import Group
from rich.text import Text

from common.broker import topology
from common.ops import crawl_progress
from common.work.pressure import BACKLOG, ERRORS, MEMORY

#: Rows shown of each list when the height is not limited (a pipe, a file).
DOMAINS_MAX, THROTTLED_MAX, WORKERS_MAX = 10, 15, 1000
_CUT = "…"


def fitted_size() -> tuple[int | None, int | None]:
    """(columns, lines) to fit: the terminal's when stdout is one or COLUMNS/LINES say so;
    (None, None) for a pipe or a file, which get every line whole."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS") or os.environ.get("LINES"):
        size = shutil.get_terminal_size()
        return size.columns, size.lines
    return None, None


def render(snapshot: dict[str, Any], width: int | None = None,
           height: int | None = None) -> str:
    """The table: at most ``width`` columns and ``height`` lines when given."""
    return "\n".join(_lines(snapshot, width, height))


def render_rich(snapshot: dict[str, Any], width: int | None = None,
                height: int | None = None) -> Group:
    """The same lines for the live view, warnings and pauses highlighted."""
    texts = []
    for line in _lines(snapshot, width, height):
        style = ("bold red" if line.startswith("WARNING") else
                 "yellow" if "paused" in line or "stalled" in line else
                 "bold" if line.startswith("progress") else "")
        texts.append(Text(line, style=style, no_wrap=True, overflow="ellipsis"))
    return Group(*texts)


def _lines(snapshot: dict[str, Any], width: int | None, height: int | None) -> list[str]:
    core = [*crawl_progress.progress_lines(snapshot["progress"], width),
            _results_line(snapshot), *_job_lines(snapshot.get("jobs") or []),
            *_dead_letter_lines(snapshot, width),
            *_queue_lines(snapshot, height is not None), _counters_line(snapshot),
            *_pressure_lines(snapshot["pressure"], short=width is not None)]
    sections = [
        ("domains (requests in window / limit):", _domain_rows(snapshot), DOMAINS_MAX),
        ("throttled domains:", _throttle_rows(snapshot), THROTTLED_MAX),
        *([(_deferred_header(snapshot), _deferred_rows(snapshot), DOMAINS_MAX)]
          if (snapshot.get("deferred") or {}).get("total") else []),
        *([("proxies (served / failed):", _proxy_rows(snapshot), THROTTLED_MAX)]
          if snapshot.get("proxies") else []),
        (f"workers alive: {len(snapshot['workers'])}", _worker_rows(snapshot, width),
         WORKERS_MAX)]
    budget = None if height is None else height - len(core)
    lines = core + _fit_sections(sections, budget)
    if height is not None and len(lines) > height:
        lines = lines[:height - 1] + [f"{_CUT} {len(lines) - height + 1} more lines: a taller "
                                      "terminal, or --json"]
    return [_clip(line, width) for line in lines]


def _fit_sections(sections: list[tuple[str, list[str], int]], budget: int | None) -> list[str]:
    """Each section's header and its first rows: up to its cap without ``budget``, else as
    many as ``budget`` lines allow, shared out a row at a time (workers first, then the others
    in order). A header whose rows are not all shown ends with ``(+N more)``."""
    sections = [(h, rows, cap) for h, rows, cap in sections if rows or h.startswith("workers")]
    if budget is None:
        shown = [min(len(rows), cap) for _h, rows, cap in sections]
    else:
        order = [len(sections) - 1, *range(len(sections) - 1)]  # workers are last in the view
        order = [i for i in order if i < max(0, budget)]
        left = max(0, budget) - len(order)
        shown = [0] * len(sections)
        while left > 0 and any(shown[i] < len(sections[i][1]) for i in order):
            for i in [order[0], *order]:  # workers two rows a round
                if left > 0 and shown[i] < len(sections[i][1]):
                    shown[i] += 1
                    left -= 1
        sections = [s if i in order else ("", [], 0) for i, s in enumerate(sections)]
    out: list[str] = []
    for (header, rows, _cap), n in zip(sections, shown, strict=True):
        if not header:
            continue
        out.append(header if n == len(rows) else f"{header} (+{len(rows) - n:,} more)")
        out += rows[:n]
    return out


def _clip(line: str, width: int | None) -> str:
    return line if width is None or len(line) <= width else line[:width - 1] + _CUT


def _results_line(snapshot: dict[str, Any]) -> str:
    detail = snapshot.get("results_detail") or {}
    line = f"results: {snapshot['results']:,} recorded"
    for name, sink in (detail.get("sinks") or {}).items():
        if sink["written"] is None:
            line += f"; sink {name}: not reading yet"
        else:
            line += f"; sink {name}: {sink['written']:,} written, {sink['waiting']:,} waiting"
    if not detail.get("sinks"):
        line += f", {detail.get('in_stream', 0):,} in the stream (no sink)"
    return line


def _job_lines(jobs: list[dict[str, Any]]) -> list[str]:
    """``jobs: 2`` and a line per job; nothing when the fleet has none (the lines above are
    the default job's, as before jobs)."""
    if not jobs:
        return []
    lines = [f"jobs: {len(jobs)} (`scrape-fleet job show NAME`)"]
    for job in jobs:
        rate = "-" if job["pages_per_s"] is None else f"{job['pages_per_s']:g}"
        lines.append(f"  job {job['name']}: {job['state']}, run {job['run']}, "
                     f"{job['done']:,}/{job['known']:,} done, {rate} pages/s, "
                     f"{job['failed']:,} failed")
    return lines


def _reasons(by_reason: dict[str, int]) -> str:
    return ", ".join(f"{reason} {n:,}" for reason, n in by_reason.items())


def _dead_letter_lines(snapshot: dict[str, Any], width: int | None) -> list[str]:
    """``dead letters now: 1 (http_404 1) | ever: 5 (fetch_blocked 4, http_404 1)``."""
    dead = snapshot["dead_letters"]
    now = f"dead letters now: {dead['now']:,}"
    if dead["now_by_reason"]:
        of = f"of the first {dead['by_reason_of']:,}: " if dead["by_reason_of"] < dead["now"] \
            else ""
        now += f" ({of}{_reasons(dead['now_by_reason'])})"
    ever = f"ever: {dead['ever']:,}" + (f" ({_reasons(dead['ever_by_reason'])})"
                                          if dead["ever_by_reason"] else "")
    if width is None or len(now) + 3 + len(ever) <= width:
        return [f"{now} | {ever}"]
    return [now, f"dead letters {ever}"]


def _queue_lines(snapshot: dict[str, Any], fitted: bool) -> list[str]:
    """The queues table; ``fitted``: the work queues only (the failed and expired queues'
    counts are on the dead letters and counters lines)."""
    lines = [f"{'queue':<16}{'ready':>9}{'unacked':>9}{'consumers':>10}{'in/s':>8}{'out/s':>8}"]
    for name, q in snapshot["queues"].items():
        if fitted and name not in topology.CONSUMED_QUEUES:
            continue
        lines.append(f"{name:<16}{q['ready']:>9}{_dash(q['unacked']):>9}{q['consumers']:>10}"
                     f"{_dash(q['publish_rate']):>8}{_dash(q['deliver_rate']):>8}")
    return lines + [f"{'hold.* (delayed)':<16}{snapshot['delayed']:>9}"]


#: stats:counters of the session pools and logins (common/work/identities.py, sessions.py).
SESSION_COUNTERS = ("sessions_retired", "session_logins", "session_logins_failed")
#: stats:counters of the download workers (common/media/steps.py).
ASSET_COUNTERS = ("assets_stored", "assets_existing", "asset_bytes")


def _counters_line(snapshot: dict[str, Any]) -> str:
    cache = snapshot["cache"]
    ratio = "-" if cache["hit_ratio"] is None else f"{cache['hit_ratio']:.2f}"
    line = (f"seen URLs: {snapshot['seen']:,}  expired: {snapshot['expired']:,}  "
            f"robots-blocked: {snapshot['robots_blocked']:,}  retries: {snapshot['retries']:,}"
            f"  cache hit ratio: {ratio}")
    if snapshot["user_code_stopped"]:  # rules and EXTRACTOR stopped: see data_errors
        line += f"  user code stopped: {snapshot['user_code_stopped']}"
    counters = snapshot.get("counters") or {}
    sessions = {name: int(counters.get(name, 0)) for name in SESSION_COUNTERS}
    if any(sessions.values()):  # session pools and logins (docs/real-web.md)
        line += (f"  sessions retired: {sessions['sessions_retired']:,}  logins: "
                 f"{sessions['session_logins']:,} ({sessions['session_logins_failed']:,} "
                 "failed)")
    assets = {name: int(counters.get(name, 0)) for name in ASSET_COUNTERS}
    if any(assets.values()):  # the media stage (docs/media.md)
        line += (f"  assets: {assets['assets_stored']:,} stored, {assets['assets_existing']:,}"
                 f" already stored, {assets['asset_bytes'] / 2**20:,.1f} MiB")
    return line


def _pressure_lines(pressure: dict[str, Any], short: bool = False) -> list[str]:
    """The backpressure part: one line for the fleet (``short``: its figures only), one per
    warning."""
    memory, backlog = pressure["redis_memory"], pressure["results_backlog"]
    state = f"paused: {', '.join(pressure['paused'])}" if pressure["paused"] else "running"
    if short:
        used = "-" if memory["ratio"] is None else f"{memory['ratio']:.2f}"
        sink = backlog["sink"] or "no sink"
        lines = [f"pressure: {state} | Redis memory {used} of max | results backlog "
                 f"{backlog['entries']:,} ({sink})"]
    else:
        used = ("no maxmemory" if memory["ratio"] is None else
                f"{memory['ratio']:.2f} of maxmemory ({memory['used']:,} / {memory['max']:,} B)")
        sink = f", sink {backlog['sink']}" if backlog["sink"] else ", no sink registered"
        lines = [f"pressure: {state} | Redis memory {used}, pause above {memory['high']:g}, "
                 f"resume below {memory['low']:g} | results backlog {backlog['entries']:,}"
                 f"{sink}, pause above {backlog['high']:,}, resume below {backlog['low']:,}"]
    return lines + [f"WARNING: {text}" for text in pressure["warnings"]]


def worker_state(worker: dict[str, Any]) -> str:
    """A worker's pause state in words: running, or paused and why, with its figures."""
    p = worker.get("pressure") or {}
    if not p.get("paused"):
        state = "running"
    elif p["reason"] == MEMORY and p.get("memory_ratio") is not None:
        state = (f"paused: {MEMORY} ({p['memory_ratio']:.2f} of maxmemory, resume below "
                 f"{p['memory_low']:g})")
    elif p["reason"] == BACKLOG:
        state = (f"paused: {BACKLOG} ({p.get('backlog', 0):,} entries, sink "
                 f"{p.get('backlog_sink')}, resume below {p['backlog_low']:,})")
    elif p["reason"] == ERRORS:
        state = f"paused: {ERRORS} ({p.get('errors_in_a_row')} in a row)"
    else:
        state = f"paused: {p['reason']} ({p.get('error', '')})"
    if p.get("unhealthy"):
        state += f"; UNHEALTHY: {p['unhealthy']}"
    if worker.get("stale"):
        state += f"; heartbeat {worker['beat_age_s']:.0f}s old (Redis refusing writes?)"
    return state


def _worker_rows(snapshot: dict[str, Any], width: int | None) -> list[str]:
    """A row per worker; fitted to ``width``: no host, the pause reason without its figures,
    and the current URLs in what is left of the line."""
    rows = []
    for w in snapshot["workers"]:
        # Its deliveries by outcome: a URL parked for its turn comes back, so "processed"
        # counts it each time; done and failed are the progress line's.
        outcomes = w.get("outcomes") or {}
        counts = (f"done={outcomes.get('result', 0)} failed={outcomes.get('dead_letter', 0)} "
                  f"delayed={outcomes.get('delay', 0)} in_flight={w['in_flight']}")
        if outcomes.get("render"):
            counts += f" to_render={outcomes['render']}"  # pages it sent to the render queue
        pool = w.get("renderer")
        if pool:  # a render worker: its browsers
            counts += (f" browsers={pool.get('browsers', 0)}/{pool.get('threads', 0)} "
                       f"rendered={pool.get('pages', 0)} mem={pool.get('memory_mb', 0)}MiB")
        if width is None:
            row = f"  {w['id']} on {w['host']}: {worker_state(w)}, {counts}"
        else:
            row = f"  {w['id']}: {worker_state(w).split(' (', 1)[0]}, {counts}"
        current = list(w.get("current") or [])[:3]
        room = None if width is None else width - len(row) - len(" current=")
        if current and (room is None or room >= 12):  # URLs take what is left of the line
            row += " current=" + _clip(", ".join(current), room)
        rows.append(row)
    return rows


def _domain_rows(snapshot: dict[str, Any]) -> list[str]:
    return [f"  {row['domain']}: {row['requests_in_window']}/{row['limit']} per "
            f"{row['window_s']:g}s" for row in snapshot["domains"]]


def _throttle_rows(snapshot: dict[str, Any]) -> list[str]:
    """Each throttled domain (common/web/throttle.py): its rate or block, and why."""
    return [f"  throttled {row['domain']}: {row['text']}"
            for row in snapshot.get("throttled", [])]


def _deferred_header(snapshot: dict[str, Any]) -> str:
    deferred = snapshot["deferred"]
    return (f"deferred: {deferred['total']:,} URLs wait in Redis for their turn "
            f"({deferred['releasing']:,} being released)")


def _deferred_rows(snapshot: dict[str, Any]) -> list[str]:
    """URLs deferred in Redis (fairness, common/intake/defer.py), largest domains first."""
    return [f"  deferred {row['domain']}: {row['deferred']:,}, through in "
            f"{crawl_progress.format_duration(row['through_in_s'])}"
            for row in snapshot["deferred"]["domains"]]


def _proxy_rows(snapshot: dict[str, Any]) -> list[str]:
    """Each proxy (credentials never stored): requests served, failures, resting or not."""
    return [f"  {row['proxy']}: {row['served']:,} / {row['failed']:,}"
            + (f", resting {row['resting_s']:g}s" if row["resting_s"] else "")
            for row in snapshot["proxies"]]


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
