"""Test sites served by a process of their own, for tests whose verdict is the sites' own log.

A site in the pytest process logs a request when that process's GIL and the machine let its
thread run: with the whole suite's heap and threads in it, a request was logged up to ~80 ms
late now and then (NOTES.md #11), which reads as two requests closer than they were sent. A
process of its own logs arrivals as a remote server would. ``python -m devtools.testsite
--log-to FILE`` serves the sites and writes their logs when stopped; this reads them back.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
STOP_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class LoggedRequest:
    host: str
    path: str
    monotonic_s: float  # CLOCK_MONOTONIC is one clock for every process of the machine


class SitesProcess:
    """``n`` sites on consecutive loopback hosts from ``first_host``, in a child process.

    ``with SitesProcess(5, "127.0.0.21", pages=20) as sites:`` ... ``sites.stop()`` returns
    each host's requests, oldest first (every request is logged before it is answered).
    """

    def __init__(self, n: int, first_host: str, *, pages: int = 200,
                 links_per_page: int = 10) -> None:
        self._workdir = tempfile.TemporaryDirectory(prefix="sites-")
        self._log_path = Path(self._workdir.name) / "requests.jsonl"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.testsite", "--sites", str(n),
             "--first-host", first_host, "--pages", str(pages),
             "--links-per-page", str(links_per_page), "--log-to", str(self._log_path)],
            cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.base_urls: list[str] = []
        try:
            for _ in range(n):  # one base URL a line once it serves (testsite.main)
                line = self._proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"test sites exited early (code {self._proc.wait()})")
                self.base_urls.append(line.strip())
        except BaseException:
            self._discard()
            raise
        self._logs: dict[str, list[LoggedRequest]] | None = None

    @property
    def hosts(self) -> list[str]:
        return [url.split("//", 1)[1].rsplit(":", 1)[0] for url in self.base_urls]

    def page_url(self, site: int, n: int) -> str:
        return f"{self.base_urls[site]}/page/{n}"

    def stop(self) -> dict[str, list[LoggedRequest]]:
        """Stop serving; each host's request log (every host present, maybe empty)."""
        if self._logs is None:
            self._proc.send_signal(signal.SIGTERM)
            code = self._proc.wait(STOP_TIMEOUT_S)
            if code != 0:
                raise RuntimeError(f"test sites exited with code {code}")
            logs: dict[str, list[LoggedRequest]] = {host: [] for host in self.hosts}
            with open(self._log_path, encoding="utf-8") as lines:
                for line in lines:
                    entry = json.loads(line)
                    logs[entry["host"]].append(LoggedRequest(**entry))
            self._logs = logs
            self._discard()
        return self._logs

    def __enter__(self) -> SitesProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._logs is None:  # not stopped, or its stop failed
            self._discard()

    def _discard(self) -> None:
        """Kill the sites if they still run; drop their pipe and files."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._proc.stdout.close()
        self._workdir.cleanup()
