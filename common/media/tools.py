"""Optional tool-backed downloaders (yt-dlp, gallery-dl) behind the downloader's interface: off by default.

:class:`ToolDownloader` hands a media request's URL to an extraction tool (a site's page for a
video, say) and returns the one file it wrote as a :class:`~common.media.download.Download`,
like :class:`~common.media.download.Downloader` does: a spool file (``asset-*``), its sha256,
size and type. The tool is untrusted code as far as the worker goes, so each run is:

* a child process of its own (``python -m <module>`` via a tiny launcher, no shell) in a new
  session, so its whole process group is killed at MEDIA_TIMEOUT_S (``timeout``, transient);
* bounded by resource limits the launcher sets before the tool is imported: RLIMIT_AS
  (:data:`MEMORY_LIMIT_BYTES`) and RLIMIT_FSIZE (the largest MEDIA_MAX_BYTES cap, one byte
  more: a body that grows past every cap fails its write). The limits are set in the child,
  not in ``preexec_fn``, which is unsafe in the worker's threaded process;
* given a clean environment (no credentials of the worker's, HOME its own temporary
  directory), no configuration file, no cache, no plugin directories; yt-dlp's native
  downloader only (no ffmpeg or aria2c connecting on its own);
* connected only through a :class:`~common.web.browser_guard.GuardProxy` (SOCKS5 on
  loopback, started once per ToolDownloader): the proxy resolves each target and refuses it
  unless every address passes the fleet's address guard (FETCH_ALLOW_NETWORKS), as the
  browser's connections are;
* written into a fresh directory inside the spool directory, removed on any error.

The type is guessed from the output file's extension (:mod:`mimetypes`) and must be one of the
request's ``types`` (``type_refused``); the file must be within its type's cap (``too_large``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import mimetypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.media_types import cap_for, largest_cap, wanted
from common.core.redact import redact_url, scrub, url_secrets
from common.media.download import Download
from common.web import multi, trust
from common.web.browser_guard import GuardProxy
from common.web.netguard import AddressGuard

logger = logging.getLogger(__name__)

#: Address space of a tool's child process (RLIMIT_AS): yt-dlp needs ~100 MB.
MEMORY_LIMIT_BYTES = 1024 * 1024 * 1024
#: Lines of the tool's output kept in a ``tool_failed`` message.
TAIL_LINES = 5
_TAIL_CHARS = 1000
_HASH_CHUNK = 1024 * 1024
#: What a SOCKS client says of the guard proxy's refusal (reply 2, "not allowed by ruleset").
_REFUSED = "connection not allowed by ruleset"
#: What the tools say of a file over their size limit, and a write past RLIMIT_FSIZE (EFBIG).
_OVER_CAP = ("larger than max-filesize", "file size larger than allowed maximum",
             "[errno 27]")
#: Sets the limits, then runs the tool's module as ``python -m`` would (argv: memory bytes,
#: file-size bytes, module, the tool's arguments).
_LAUNCHER = (
    "import resource, runpy, sys\n"
    "resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))\n"
    "resource.setrlimit(resource.RLIMIT_CORE, (0, 0))\n"
    "module = sys.argv[3]\n"
    "sys.argv = [module, *sys.argv[4:]]\n"
    "runpy.run_module(module, run_name='__main__', alter_sys=True)\n")


@dataclass(frozen=True)
class Run:
    """What a tool is told for one download."""

    url: str
    out_dir: Path
    max_bytes: int
    proxy: str
    settings: Settings


@dataclass(frozen=True)
class Tool:
    """An extraction tool: the module ``python -m`` runs and its arguments for one run."""

    module: str
    arguments: Callable[[Run], list[str]]


def yt_dlp_arguments(run: Run) -> list[str]:
    """yt-dlp: one file (the best single format, no merging), into ``run.out_dir``."""
    arguments = [
        "--no-config", "--no-cache-dir", "--no-plugin-dirs", "--no-playlist",
        "--playlist-items", "1", "--no-part", "--no-mtime", "--no-progress", "--no-warnings",
        "--downloader", "native", "--compat-options", "no-certifi", "--retries", "1",
        "--fragment-retries", "1", "--format", "b/bv*/ba*",
        "--proxy", run.proxy, "--max-filesize", str(run.max_bytes),
        "--socket-timeout", f"{run.settings.read_timeout_s:g}",
        "--user-agent", run.settings.user_agent,
        "--output", str(run.out_dir / "asset.%(ext)s")]
    if trust.insecure(run.settings, urlsplit(run.url).hostname):
        arguments.append("--no-check-certificates")
    return [*arguments, "--", run.url]


def gallery_dl_arguments(run: Run) -> list[str]:
    """gallery-dl: the first file of a gallery's URL (or a direct link), into ``run.out_dir``."""
    arguments = [
        "--config-ignore", "--no-input", "--no-part", "--no-mtime", "--no-skip", "--range", "1",
        "--retries", "1", "--http-timeout", f"{run.settings.read_timeout_s:g}",
        "--proxy", run.proxy, "--filesize-max", str(run.max_bytes),
        "--user-agent", run.settings.user_agent,
        "--directory", str(run.out_dir), "--filename", "asset.{extension}"]
    if trust.insecure(run.settings, urlsplit(run.url).hostname):
        arguments.append("--no-check-certificate")
    return [*arguments, "--", run.url]


#: The tools a media request may name (MEDIA_TOOLS narrows them); each is optional: one whose
#: module is not installed fails as ``tool_missing`` (requirements-media-tools.lock).
TOOLS: dict[str, Tool] = {"yt-dlp": Tool("yt_dlp", yt_dlp_arguments),
                          "gallery-dl": Tool("gallery_dl", gallery_dl_arguments)}


class ToolDownloader:
    """Downloads with an extraction tool in a limited child process, through the guard proxy.

    Thread-safe: each download has its own child and directory; the proxy serves them all.
    """

    def __init__(self, settings: Settings, guard: AddressGuard | None = None,
                 tools: dict[str, Tool] | None = None) -> None:
        self.settings = settings
        self.tools = TOOLS if tools is None else tools
        self.ca_file = trust.ca_file(settings)  # a bad FETCH_CA_BUNDLE stops the process now
        self.proxy = GuardProxy(guard or AddressGuard(settings.fetch_allow_networks))

    def close(self) -> None:
        self.proxy.close()

    def installed(self, tool: str) -> bool:
        found = self.tools.get(tool)
        return found is not None and importlib.util.find_spec(found.module) is not None

    def download(self, url: str, *, tool: str, types: tuple[str, ...],
                 caps: tuple[tuple[str, int], ...] | None = None,
                 spool_dir: Path | None = None) -> Download:
        """Run ``tool`` on ``url``; its one output file becomes the Download's spool file.

        Raises:
            FetchError: ``kind`` tool_missing (not installed, or no such tool), tool_failed
                (it exited non-zero or wrote no file: the last lines of its output), blocked
                (the guard proxy refused a connection of it), timeout (transient: killed at
                MEDIA_TIMEOUT_S), too_large, type_refused.
            OSError: the spool directory could not be used (the worker's disk).
        """
        if not self.installed(tool):
            raise FetchError(f"tool {tool!r} is not installed here (requirements-media-tools"
                             ".lock)", kind="tool_missing")
        caps = caps or self.settings.media_max_bytes
        directory = spool_dir or self.settings.media_spool_dir or tempfile.gettempdir()
        work = Path(tempfile.mkdtemp(dir=directory, prefix="tool-"))
        kept: Path | None = None
        started, sent_at = time.perf_counter(), time.time()
        try:
            out_dir = work / "out"
            out_dir.mkdir()
            proxy = self.proxy.url.replace("socks5://", "socks5h://", 1)  # the proxy resolves
            run = Run(url, out_dir, largest_cap(caps), proxy, self.settings)
            try:
                code = self._run(self.tools[tool], run, work)
            except FetchError as exc:  # the timeout
                exc.sent_at = sent_at
                raise
            files = sorted(p for p in out_dir.iterdir() if p.is_file())
            grown = [p for p in files if p.stat().st_size > run.max_bytes]
            if grown or _over_cap(work / "log"):
                raise FetchError(f"{redact_url(url)}: {tool}'s file is larger than "
                                 f"{run.max_bytes} bytes (MEDIA_MAX_BYTES)", kind="too_large",
                                 sent_at=sent_at)
            if code != 0 and _REFUSED in _read_end(work / "log").lower():
                raise FetchError(f"{redact_url(url)}: a connection of {tool} was refused by the "
                                 "address guard (FETCH_ALLOW_NETWORKS)", kind="blocked",
                                 sent_at=sent_at)
            if code != 0 or len(files) != 1:
                what = (f"exited with {code}" if code != 0
                        else f"wrote {len(files)} files, not one")
                raise FetchError(f"{redact_url(url)}: {tool} {what}: "
                                 f"{_tail(work / 'log', url) or '(no output)'}",
                                 kind="tool_failed", sent_at=sent_at)
            kept, media_type = self._keep(files[0], url, types, caps, directory, sent_at)
            return Download(url, url, 200, media_type, kept.stat().st_size, _sha256(kept), kept,
                            (time.perf_counter() - started) * 1000, sent_at, 0, {})
        except BaseException:
            if kept is not None:
                kept.unlink(missing_ok=True)
            raise
        finally:
            shutil.rmtree(work, onerror=_not_removed)

    def _run(self, tool: Tool, run: Run, work: Path) -> int:
        """The tool's child process to its end; its exit code (a signal's is negative).

        Raises:
            FetchError: ``timeout`` once MEDIA_TIMEOUT_S passed (its group killed first).
        """
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(work), "LC_ALL": "C.UTF-8",
               "SSL_CERT_FILE": self.ca_file, "REQUESTS_CA_BUNDLE": self.ca_file,
               "TMPDIR": str(work)}  # nothing of the worker's: no credentials, no proxies
        command = [sys.executable, "-I", "-B", "-c", _LAUNCHER,  # -I: no PYTHON* variables
                   str(MEMORY_LIMIT_BYTES), str(run.max_bytes + 1), tool.module,
                   *tool.arguments(run)]
        timeout_s = self.settings.media_timeout_s
        with (work / "log").open("wb") as log:
            child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, cwd=work, env=env,
                                     start_new_session=True, close_fds=True)
        try:
            exited = _wait(child, timeout_s)
        finally:
            _kill_group(child)
        if not exited:
            raise FetchError(f"{redact_url(run.url)}: the tool took longer than {timeout_s:g}s "
                             "(MEDIA_TIMEOUT_S): killed", kind="timeout")
        return int(child.returncode)

    def _keep(self, found: Path, url: str, types: tuple[str, ...],
              caps: tuple[tuple[str, int], ...], directory: str | Path,
              sent_at: float) -> tuple[Path, str]:
        """The output file checked against the types and its cap, moved to a spool file."""
        media_type, size = _type_of(found), found.stat().st_size
        if not wanted(types, media_type):
            raise FetchError(f"{redact_url(url)}: {media_type} ({found.name}) is not one of "
                             f"{', '.join(types)}", kind="type_refused", sent_at=sent_at)
        cap = cap_for(caps, media_type)
        if size > cap:
            raise FetchError(f"{redact_url(url)}: {size} bytes of {media_type}, over its cap "
                             f"{cap} (MEDIA_MAX_BYTES)", kind="too_large", sent_at=sent_at)
        fd, name = tempfile.mkstemp(dir=directory, prefix="asset-")
        os.close(fd)
        os.replace(found, name)  # the same file system: the work directory is beside it
        return Path(name), media_type


def _wait(child: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Wait for ``child`` to exit within ``timeout_s`` (True) or not (False). In a fetch loop's
    task the loop's other downloads go on meanwhile (its pidfd is waited on)."""
    deadline = time.monotonic() + timeout_s
    try:
        pidfd: int | None = os.pidfd_open(child.pid)
    except OSError:  # an old kernel: wait in this thread
        pidfd = None
    try:
        while child.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if pidfd is None or not multi.wait_fd(pidfd, left):
                try:
                    child.wait(timeout=left)
                except subprocess.TimeoutExpired:
                    return False
        return True
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    """Kill what is left of the child's process group (its own session: pgid == pid)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the group is gone: the tool and everything it started exited
    child.wait()


def _tail(log: Path, url: str) -> str:
    """The last lines of the tool's output, without the URL's credentials."""
    lines = [line.strip() for line in _read_end(log).splitlines() if line.strip()][-TAIL_LINES:]
    return scrub(" | ".join(lines), url_secrets(url))[-_TAIL_CHARS:]


def _read_end(log: Path) -> str:
    """The last 16 KiB of the tool's output."""
    try:
        with log.open("rb") as file:
            file.seek(max(0, log.stat().st_size - 16 * 1024))
            return file.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""  # the tool never started writing it: its exit code says the rest


def _not_removed(_function: object, path: str, info: object) -> None:
    logger.warning("a tool's file %s could not be removed: %s", path, info)


def _over_cap(log: Path) -> bool:
    """Whether the tool's output says the file is over its size limit (yt-dlp aborts such a
    download before its body, exiting 0) or a write failed at RLIMIT_FSIZE (EFBIG)."""
    text = _read_end(log).lower()
    return any(sign in text for sign in _OVER_CAP)


def _type_of(path: Path) -> str:
    return mimetypes.guess_type(path.name, strict=False)[0] or "application/octet-stream"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()

