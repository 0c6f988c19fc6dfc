"""Chromium's processes, found in /proc: a browser's pids, its process groups, its memory.

Playwright's driver starts Chromium in a process group of its own; a browser is known by the
group leaders it started (common/web/browser.py), so its processes can be measured (PSS) and
killed whole, renderers and zygotes included, and a test can see that none is left.

Cost (2 cores, loaded by other browsers; a browser of 6-9 processes): a scan of /proc
(:func:`chromium_pids`) took 10-105 ms, their PSS (:func:`memory_bytes`: smaps_rollup walks
every mapping of Chromium's huge address spaces) 22-180 ms; the walk from the group leaders
(:func:`descendants`) 1-50 ms (mostly 1-5) and :func:`pss_estimate` (statm) microseconds. The
check after each page (RENDER_MAX_BROWSER_MB) uses these two: the estimate was 20-60 % above
the PSS (183-246 MiB measured, 290-327 estimated), so a browser is replaced early, never late.
"""

from __future__ import annotations

import os
from typing import NamedTuple


class Process(NamedTuple):
    """One line of /proc/PID/stat, what the fleet reads of it."""

    parent: int
    group: int
    name: str
    state: str  # "Z": a zombie, holding nothing but its entry
    started: str  # start time in clock ticks: a pid and this name one process


def _stat(pid: int | str) -> Process | None:
    """/proc/PID/stat read, or None when the process has exited meanwhile."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None  # exited meanwhile
    fields = stat[stat.rindex(")") + 2:].split()
    return Process(int(fields[1]), int(fields[2]), stat[stat.index("(") + 1:stat.rindex(")")],
                   fields[0], fields[19])


def process_table() -> dict[int, Process]:
    """Every process now, from /proc (one that exits meanwhile is left out)."""
    table: dict[int, Process] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (proc := _stat(entry)) is not None:
            table[int(entry)] = proc
    return table


def below(table: dict[int, Process], pid: int) -> set[int]:
    """The pids below ``pid`` in ``table`` (children, their children...)."""
    found = {pid}
    changed = True
    while changed:
        more = {p for p, proc in table.items() if proc.parent in found} - found
        changed = bool(more)
        found |= more
    return found - {pid}


def chromium_pids(groups: set[int] | None = None) -> set[int]:
    """The pids of this process's descendants running Chromium (read from /proc).

    Args:
        groups: only those in these process groups (a browser's: :attr:`Browser.groups`).
    """
    table = process_table()
    return {pid for pid in below(table, os.getpid()) if "chrom" in table[pid].name
            and (groups is None or table[pid].group in groups)}


def group_of(pid: int) -> int | None:
    """The process group of ``pid``; None when it has exited."""
    proc = _stat(pid)
    return proc.group if proc is not None else None


def memory_bytes(pids: set[int]) -> int:
    """The proportional set size of these processes (shared pages divided among them)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup", encoding="utf-8") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f
                             if line.startswith("Pss:"))
        except OSError:
            continue  # exited meanwhile
    return total


def descendants(leaders: set[int]) -> set[int]:
    """``leaders`` and every process below them, from each thread's ``children`` list (a
    process forked by any thread of its parent is there; no scan of /proc)."""
    seen: set[int] = set()
    todo = list(leaders)
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue  # exited meanwhile
        seen.add(pid)
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                    todo.extend(int(child) for child in f.read().split())
            except OSError:
                continue  # the thread ended meanwhile
    return seen


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def pss_estimate(pids: set[int]) -> int:
    """What these processes hold, at least their PSS, from statm (microseconds where PSS takes
    tens of milliseconds): each one's resident memory less its shared pages, plus the largest
    shared part once (Chromium's binary and libraries; shared memory counted high)."""
    private = shared = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm", encoding="ascii") as f:
                fields = f.read().split()
        except OSError:
            continue  # exited meanwhile
        private += int(fields[1]) - int(fields[2])
        shared = max(shared, int(fields[2]))
    return (private + shared) * _PAGE_BYTES
