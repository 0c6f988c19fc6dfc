"""What ``scrape-fleet job`` prints: the jobs table, one job's page, its runs (the jobs section
of ``scrape-fleet status`` is common/ops/status_view.py's). Plain text lines, as the status
view's: whole in a pipe.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from common.jobs.progress import RunProgress
from common.jobs.registry import JobState
from common.jobs.spec import JobSpec
from common.ops.cli import escape_controls
from common.ops.crawl_progress import format_duration

LIST_HEADER = (f"{'name':<20} {'state':<9} {'run':>4} {'done/known':>15} {'pages/s':>8} "
               f"{'ETA':>7} {'failed':>7} {'priority':<8} schedule")


def rate_text(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def eta_text(progress: RunProgress) -> str:
    if progress.state == "finished":
        return "done"
    if progress.state in ("cancelled", "created"):
        return "-"
    if progress.known and not progress.left:
        return "0s"
    return format_duration(progress.eta_s)


def schedule_text(spec: JobSpec | None) -> str:
    if spec is None or spec.schedule is None:
        return "-"
    if spec.schedule.every_s:
        return f"every {format_duration(spec.schedule.every_s)}"
    return f"cron {spec.schedule.cron}"


def list_row(progress: RunProgress, spec: JobSpec | None) -> str:
    done = f"{progress.done:,}/{progress.known:,}"
    return (f"{progress.name:<20} {progress.state:<9} {progress.run:>4} {done:>15} "
            f"{rate_text(progress.pages_per_s):>8} {eta_text(progress):>7} "
            f"{progress.failed:>7,} {spec.priority if spec else '-':<8} {schedule_text(spec)}")


def when(ms: int) -> str:
    """``2026-11-26 14:03:07 UTC (5m12s ago)``; ``-`` for 0."""
    if not ms:
        return "-"
    text = datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    delta = ms / 1000 - time.time()
    return f"{text} ({format_duration(abs(delta))} {'from now' if delta > 0 else 'ago'})"


def _limits(spec: JobSpec) -> str:
    parts = [f"pages {spec.limits.pages:,}" if spec.limits.pages else "",
             f"duration {format_duration(spec.limits.duration_s)}"
             if spec.limits.duration_s else "",
             f"bytes {spec.limits.bytes:,}" if spec.limits.bytes else ""]
    return ", ".join(p for p in parts if p) or "none"


def show_lines(state: JobState, spec: JobSpec | None, seeds: int, progress: RunProgress,
               domains: list[dict[str, Any]]) -> list[str]:
    """``job show``: the definition in short, the state, the current run's progress, the
    domains of its seeds with the fleet's throttle and deferred URLs there."""
    lines = [f"job {state.name}: {state.state}" + (f", run {state.run}" if state.run else
                                                  ", no run yet")
             + (f" ({state.reason})" if state.reason else "")]
    if spec is not None:
        if spec.description:
            lines.append(f"  {escape_controls(spec.description)}")
        lines.append(f"  seeds: {seeds:,} URLs, {len(spec.sitemaps)} sitemaps; priority "
                     f"{spec.priority}; limits: {_limits(spec)}; schedule: "
                     f"{schedule_text(spec)}")
        if spec.knobs:  # proxy credentials redacted
            shown = ", ".join(f"{k}={_short(v)}" for k, v in sorted(spec.shown_knobs().items()))
            lines.append(f"  settings: {escape_controls(shown)}")
        if spec.rate_limit:
            amount, window_ms = spec.rate_limit
            lines.append(f"  politeness: {amount} per {window_ms / 1000:g}s a domain")
        if spec.webhooks:
            lines.append(f"  webhooks: {', '.join(spec.webhooks)}")
    lines.append(f"  submitted {when(state.submitted)}; started {when(state.started)}; "
                 f"ended {when(state.ended)}"
                 + (f"; next run {when(state.next_run)}" if state.next_run else ""))
    if state.run:
        lines += progress_lines(progress)
    if domains:
        lines.append("domains (the fleet's state there, shared by every job):")
        lines += [f"  {d['domain']}: {d['throttle'] or 'not throttled'}; "
                  f"{d['deferred']:,} URLs deferred" for d in domains]
    return lines


def progress_lines(progress: RunProgress) -> list[str]:
    percent = f" ({100 * progress.done / progress.known:.1f}%)" if progress.known else ""
    rate = ("no rate measured" if progress.pages_per_s is None else
            f"{rate_text(progress.pages_per_s)} pages/s, {rate_text(progress.outcomes_per_s)} "
            f"outcomes/s over the last {format_duration(progress.rate_over_s)}")
    reasons = ", ".join(f"{r} {n:,}" for r, n in progress.failed_by_reason.items())
    return [f"progress of run {progress.run}: {progress.done:,} done of {progress.known:,} "
            f"known{percent}, {progress.left:,} to do | {rate} | ETA {eta_text(progress)}",
            f"  results {progress.results:,}, failed {progress.failed:,}"
            + (f" ({reasons})" if reasons else "")
            + f", cancelled {progress.cancelled:,}, expired {progress.expired:,}, "
            f"bytes {progress.bytes:,}, parked {progress.paused:,}"]


def run_line(run: int, counters: dict[str, int]) -> str:
    return (f"run {run}: known {counters.get('known', 0):,}, results "
            f"{counters.get('results', 0):,}, failed {counters.get('failed', 0):,}, cancelled "
            f"{counters.get('cancelled', 0):,}, expired {counters.get('expired', 0):,}, bytes "
            f"{counters.get('bytes', 0):,}; started {when(counters.get('started', 0))}, "
            f"ended {when(counters.get('ended', 0))}")


def _short(value: str, limit: int = 40) -> str:
    one_line = value.replace("\n", " ")
    return one_line if len(one_line) <= limit else one_line[:limit - 1] + "…"
