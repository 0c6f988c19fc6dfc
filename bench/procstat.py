"""Process accounting for the bench: CPU and peak memory of children, from the kernel.

:class:`Watched` starts a child, samples its CPU time from ``/proc/PID/stat`` while it runs (so
the CPU spent before a moment, e.g. start-up before the first page, can be subtracted), and
reaps it with ``os.wait4`` to get its exact final CPU (its reaped children's included, so a
sample counts its live children's too: a worker's user-code children). Its peak resident set is the highest
VmHWM read from ``/proc/PID/status`` while it ran (every sample, and every 50 ms while it is
being reaped), not wait4's ``ru_maxrss``: Linux keeps in ``ru_maxrss`` the high-water mark of
the memory a child had before its ``exec``, and a child spawned with vfork (as subprocess
does) had the parent's, so every child of a 130 MB bench process reported at least 130 MB
(NOTES #20). :func:`group_cpu_s` sums the CPU of a process group (the services run each in
their own group).
"""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of ``pid`` (all its threads) in seconds; None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children_of(pid: int) -> list[int]:
    """The live child processes of ``pid`` (every thread's), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def proc_rss_kb(pid: int) -> tuple[int, int] | None:
    """(VmRSS, VmHWM) of ``pid`` in KiB; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    values = {}
    for line in text.splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            name, value = line.split(":", 1)
            values[name] = int(value.split()[0])
    return values.get("VmRSS", 0), values.get("VmHWM", 0)


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    pgid: int
    start: int
    comm: str
    cpu_s: float


def read_procs() -> dict[int, Proc]:
    """Every live process: parent, group, start time (ticks since boot), name, CPU."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        comm = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw[raw.rindex(")") + 2:].split()
        found[int(entry)] = Proc(int(entry), int(f[1]), int(f[2]), int(f[19]), comm,
                                 (int(f[11]) + int(f[12])) / CLOCK_TICKS)
    return found


def cpu_s_where(field: int, value: int) -> float:
    """Summed utime + stime of the live processes whose /proc stat field number ``field``
    (after the command: 1 = parent pid, 2 = process group) equals ``value``."""
    key = {1: "ppid", 2: "pgid"}[field]
    return sum(proc.cpu_s for proc in read_procs().values() if getattr(proc, key) == value)


def group_cpu_s(pgid: int) -> float:
    """Summed utime + stime of the live processes in process group ``pgid``."""
    return cpu_s_where(2, pgid)


@dataclass
class Watched:
    """A child process with CPU samples and, once reaped, its rusage.

    Attributes:
        samples: (time.time(), cpu_s) pairs taken every ``interval_s`` while it ran.
        cpu_s: final user + system CPU (from wait4), once exited.
        maxrss_kb: peak resident set (the highest VmHWM read; see the module doc), once
            exited; None if it exited before a reading.
    """

    proc: subprocess.Popen[bytes]
    name: str
    interval_s: float = 0.2
    samples: list[tuple[float, float]] = field(default_factory=list)
    cpu_s: float | None = None
    maxrss_kb: int | None = None
    peak_hwm_kb: int = 0
    returncode: int | None = None
    _thread: threading.Thread | None = None
    _done: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, cmd: Sequence[str], *, name: str, env: Mapping[str, str], cwd: Path,
              log_path: Path | None = None, interval_s: float = 0.2) -> Watched:
        stdout = log_path.open("wb") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(list(cmd), cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                                    stdout=stdout, stderr=subprocess.STDOUT)
        finally:
            if log_path:
                stdout.close()  # type: ignore[union-attr]
        watched = cls(proc, name, interval_s)
        watched._thread = threading.Thread(target=watched._sample, name=f"watch-{name}",
                                           daemon=True)
        watched._thread.start()
        return watched

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _sample(self) -> None:
        while not self._done.is_set():
            cpu = proc_cpu_s(self.proc.pid)
            if cpu is not None:  # with its live children's (a worker's user-code children):
                # wait4 counts them once reaped, so a sample must count them too
                cpu += sum(proc_cpu_s(child) or 0.0 for child in children_of(self.proc.pid))
                self.samples.append((time.time(), cpu))
            self._read_hwm()
            self._done.wait(self.interval_s)

    def _read_hwm(self) -> None:
        mem = proc_rss_kb(self.proc.pid)
        if mem is not None:
            self.peak_hwm_kb = max(self.peak_hwm_kb, mem[1])

    def cpu_at(self, wall_time_s: float) -> float:
        """CPU seconds used by ``wall_time_s``: the last sample taken at or before it (0 if
        none), so CPU after this moment is ``cpu_s - cpu_at(moment)``, up to one interval."""
        best = 0.0
        for when, cpu in self.samples:
            if when > wall_time_s:
                break
            best = cpu
        return best

    def wait(self, timeout_s: float) -> int:
        """Reap the child with wait4; SIGTERM after ``timeout_s``, SIGKILL 15 s later."""
        for sig, limit_s in ((None, timeout_s), (signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
            if sig is not None:
                self.terminate(sig)
            deadline = time.monotonic() + limit_s
            while True:
                self._read_hwm()
                pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
                if pid == self.proc.pid:
                    return self._reaped(status, usage)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} (pid {self.proc.pid}) survived SIGKILL")

    def terminate(self, sig: int = signal.SIGTERM) -> None:
        try:
            self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def _reaped(self, status: int, usage: resource.struct_rusage) -> int:
        self._done.set()
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.maxrss_kb = self.peak_hwm_kb or None  # not ru_maxrss: see the module doc
        self.returncode = os.waitstatus_to_exitcode(status)
        self.proc.returncode = self.returncode  # so Popen never waits on the reaped pid
        return self.returncode


def wait_all(children: Sequence[Watched], timeout_s: float) -> list[int]:
    """Reap every child; those still running after ``timeout_s`` get SIGTERM, then SIGKILL."""
    deadline = time.monotonic() + timeout_s
    codes = []
    for child in children:
        remaining = max(1.0, deadline - time.monotonic())
        code = child.wait(remaining)
        codes.append(code)
    return codes
