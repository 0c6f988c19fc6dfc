"""Forward proxies on loopback for tests: Debian's tinyproxy (HTTP, CONNECT) and dante (SOCKS5)
as children with generated configs, and a recording proxy that never connects onward.

    with TinyProxy(auth=("bob", "pw")) as proxy:        # http://bob:pw@127.0.0.1:PORT
        fetcher.fetch(url, identity=Identity(proxy=proxy.url))
        proxy.requests()                                  # [("GET", "http://..."), ...]

    with Dante() as socks:                                # socks5://127.0.0.1:PORT
        socks.url, socks.url_h, socks.connections()       # targets it connected to

    with RecordingProxy() as trap:                        # answers 502 to everything
        trap.asked                                        # what it was asked, never served

Each runs in a private temp directory (config, log, pid file) and its own process group, on
127.0.0.1 at a free port. tinyproxy's log records each request line (a CONNECT once per
tunnel; plain-http requests one per connection, tinyproxy not keeping them alive), so a test
counts what each proxy served. dante only passes CONNECTs to 127.0.0.0/8: even a bug in the
fleet's address guard cannot take a test beyond loopback through it. The recording proxy is
for the guard's own tests: it logs the request line and answers ``502`` without ever opening
a connection anywhere.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from devtools.nginx_site import free_port

TINYPROXY = "/usr/bin/tinyproxy"
DANTED = "/usr/sbin/danted"
_TINY_REQUEST = re.compile(r"Request \(file descriptor \d+\): (\S+) (\S+) HTTP/")
_DANTE_PASS = re.compile(r"pass\(\d+\): tcp/connect \[: \S+ \S+ -> \S+ (\d+\.\d+\.\d+\.\d+)\.(\d+)")


class _Child:
    """A daemon run in the foreground in its own temp directory and process group."""

    name = "proxy"
    scheme = "http"

    def __init__(self, *, host: str = "127.0.0.1", port: int | None = None,
                 start_timeout_s: float = 10.0) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.start_timeout_s = start_timeout_s
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def work_dir(self) -> Path:
        if self._dir is None:
            raise RuntimeError(f"{self.name} not started")
        return Path(self._dir.name)

    @property
    def log_file(self) -> Path:
        return self.work_dir / f"{self.name}.log"

    @property
    def url(self) -> str:
        """``scheme://[user:password@]127.0.0.1:port``: what PROXY_URLS takes."""
        return f"{self.scheme}://{self._userinfo()}{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def config(self) -> str:
        raise NotImplementedError

    def command(self, conf: Path) -> list[str]:
        raise NotImplementedError

    def _userinfo(self) -> str:
        return ""

    def start(self) -> _Child:
        self._dir = tempfile.TemporaryDirectory(prefix=f"{self.name}-")
        os.chmod(self.work_dir, 0o755)  # dante's children drop to 'nobody' and write the log
        conf = self.work_dir / f"{self.name}.conf"
        conf.write_text(self.config())
        self._proc = subprocess.Popen(
            self.command(conf), cwd=self.work_dir, stdin=subprocess.DEVNULL,
            stdout=(self.work_dir / "output.txt").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                message = f"{self.name} exited with {self._proc.returncode}: {self._tail()}"
                self.stop()
                raise RuntimeError(message)
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                if time.monotonic() > deadline:
                    message = f"{self.name} did not listen in {self.start_timeout_s} s: {self._tail()}"
                    self.stop()
                    raise RuntimeError(message) from None
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a proxy dying mid-crawl); the temp
        directory stays for the log until :meth:`stop`."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait(timeout=10)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            try:  # dante's children outlive their mother for a moment
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # the group is gone already: what we wanted
        directory, self._dir = self._dir, None
        if directory is not None:
            directory.cleanup()

    def __enter__(self) -> _Child:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def log_lines(self) -> list[str]:
        try:
            return self.log_file.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []

    def _tail(self, lines: int = 10) -> str:
        text = ""
        for path in (self.work_dir / "output.txt", self.log_file):
            if path.exists():
                text += path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"


class TinyProxy(_Child):
    """Debian's tinyproxy: an HTTP forward proxy (plain requests and CONNECT).

    Args:
        auth: (user, password): BasicAuth required (a missing one gets 407; a wrong one,
            tinyproxy 1.11's quirk, 401).
        connect_ports: the ports CONNECT may reach (empty: any).
    """

    name = "tinyproxy"

    def __init__(self, *, auth: tuple[str, str] | None = None,
                 connect_ports: tuple[int, ...] = (), **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.auth = auth
        self.connect_ports = connect_ports

    def _userinfo(self) -> str:
        return f"{self.auth[0]}:{self.auth[1]}@" if self.auth else ""

    def config(self) -> str:
        lines = [f"Port {self.port}", f"Listen {self.host}", "Timeout 30",
                 f'LogFile "{self.log_file}"', "LogLevel Connect", "MaxClients 200",
                 "Allow 127.0.0.0/8", "DisableViaHeader Yes", f'PidFile "{self.work_dir}/pid"']
        lines += [f"ConnectPort {port}" for port in self.connect_ports]
        if self.auth:
            lines.append(f"BasicAuth {self.auth[0]} {self.auth[1]}")
        return "\n".join(lines) + "\n"

    def command(self, conf: Path) -> list[str]:
        return [TINYPROXY, "-d", "-c", str(conf)]

    def requests(self) -> list[tuple[str, str]]:
        """(method, target) of each request it was asked, in order (CONNECT: host:port)."""
        return [(m.group(1), m.group(2)) for line in self.log_lines()
                if (m := _TINY_REQUEST.search(line))]


class Dante(_Child):
    """Debian's dante server: SOCKS5, no authentication, CONNECT to 127.0.0.0/8 only."""

    name = "danted"
    scheme = "socks5"

    @property
    def url_h(self) -> str:
        """The socks5h:// form: the proxy resolves the target's name."""
        return f"socks5h://{self.host}:{self.port}"

    def config(self) -> str:
        return (f"logoutput: {self.log_file}\n"
                f"internal: {self.host} port = {self.port}\n"
                f"external: {self.host}\n"
                "clientmethod: none\nsocksmethod: none\n"
                "user.privileged: root\nuser.unprivileged: nobody\n"
                "client pass {\n  from: 127.0.0.0/8 to: 0.0.0.0/0\n  log: error\n}\n"
                "socks pass {\n  from: 127.0.0.0/8 to: 127.0.0.0/8\n  command: connect\n"
                "  log: connect error\n}\n")

    def command(self, conf: Path) -> list[str]:
        return [DANTED, "-f", str(conf), "-N", "1", "-p", str(self.work_dir / "pid")]

    def connections(self) -> list[tuple[str, int]]:
        """(address, port) of each target it connected a client to, in order."""
        return [(m.group(1), int(m.group(2))) for line in self.log_lines()
                if (m := _DANTE_PASS.search(line))]


class RecordingProxy:
    """An HTTP proxy that records each request line it gets and answers 502, never opening a
    connection anywhere: the address guard's tests ask it for what must not be reached."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.asked: list[str] = []  # request lines ("CONNECT 127.0.0.2:80 HTTP/1.1", ...)
        self.connections = 0
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        if self._sock is None:
            raise RuntimeError("recording proxy not started")
        return int(self._sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> RecordingProxy:
        self._sock = socket.create_server((self.host, 0))
        self._thread = threading.Thread(target=self._accept, name="recording-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> RecordingProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _accept(self) -> None:
        sock = self._sock
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed by stop()
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    head += chunk
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                if line:
                    with self._lock:
                        self.asked.append(line)
                conn.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n"
                             b"Connection: close\r\n\r\n")
            except OSError:
                return  # the client hung up: nothing more to record
