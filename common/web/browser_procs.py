"""Chromium's processes, found in /proc: a browser's pids, its process groups, its memory.

Playwright's driver starts Chromium in a process group of its own; a browser is known by the
group leaders it started (common/web/browser.py), so its processes can be measured (PSS) and
killed whole, renderers and zygotes included, and a test can see that none is left.
"""

from __future__ import annotations

import os


def chromium_pids(groups: set[int] | None = None) -> set[int]:
    """The pids of this process's descendants running Chromium (read from /proc).

    Args:
        groups: only those in these process groups (a browser's: :attr:`Browser.groups`).
    """
    parents: dict[int, int] = {}
    names: dict[int, str] = {}
    group_of: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry)] = int(fields[1])
        group_of[int(entry)] = int(fields[2])
        names[int(entry)] = stat[stat.index("(") + 1:stat.rindex(")")]
    ours = {os.getpid()}
    changed = True
    while changed:
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        changed = bool(found)
        ours |= found
    return {pid for pid in ours if "chrom" in names.get(pid, "")
            and (groups is None or group_of.get(pid) in groups)}


def group_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


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
