"""A local PostgreSQL for the postgres result sink's tests, and where one comes from.

:func:`postgres_service` tries, in this order:

1. ``POSTGRES_URL`` from the environment, used as-is (after one test connection).
2. A ``postgres:15`` container through testcontainers, only when a *local* Docker engine
   answers and the container is reached over loopback (the same rule as
   :func:`devtools.services.fleet.fleet_services`).
3. :class:`LocalPostgres`: Debian's PostgreSQL binaries (``/usr/lib/postgresql/15/bin``, else
   the newest version there; the ``postgresql`` package, which ``scripts/bootstrap.sh``
   installs) run as a child process on a free 127.0.0.1 port, in its own temporary directory,
   with a random password.

``initdb`` and ``postgres`` refuse to run as root. As root, both run as the ``postgres``
system user that the Debian package creates (``subprocess`` drops to its uid, gid and no
supplementary groups; the temporary directory is chowned to it); as anyone else, as the
current user. The postmaster runs in the foreground in its own process group: :meth:`stop`
asks for a fast shutdown (SIGINT: running transactions are rolled back), then kills the group
(PostgreSQL puts each backend in a session of its own; they exit when the postmaster dies).

:func:`scratch_database` gives each test an empty database of its own on that server.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from common.core.redact import redact_url
from devtools.services.base import (
    LOOPBACK,
    Managed,
    ServicesUnavailable,
    free_port,
    loopback_docker_host,
    tail,
    terminate_group,
)
from devtools.services.fleet import _docker_engine_answers

logger = logging.getLogger(__name__)

POSTGRES_IMAGE = "postgres:15"
#: Where Debian keeps each major version's server binaries (initdb, postgres, pg_ctl).
POSTGRES_LIB_DIR = Path("/usr/lib/postgresql")
PREFERRED_VERSION = "15"
SYSTEM_USER = "postgres"
INSTALL_HINT = "install it with `apt-get install -y postgresql` (or run scripts/bootstrap.sh)"


def find_postgres_bin(root: Path = POSTGRES_LIB_DIR) -> Path:
    """The directory with ``initdb`` and ``postgres``: version 15 when there, else the newest.

    Raises:
        ServicesUnavailable: saying how to install PostgreSQL.
    """
    found = {}
    for candidate in root.glob("*/bin"):
        if all(os.access(candidate / name, os.X_OK) for name in ("initdb", "postgres")):
            found[candidate.parent.name] = candidate
    if not found:
        raise ServicesUnavailable(f"PostgreSQL server binaries not found in {root}/*/bin: "
                                  f"{INSTALL_HINT}")
    if PREFERRED_VERSION in found:
        return found[PREFERRED_VERSION]
    return found[max(found, key=lambda v: [int(p) for p in re.findall(r"\d+", v)] or [0])]


def _run_as() -> pwd.struct_passwd | None:
    """Whom to run the server as: ``postgres`` when we are root, None (ourselves) otherwise."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        raise ServicesUnavailable(
            f"running as root, and PostgreSQL refuses root: no {SYSTEM_USER!r} user to run it "
            f"as ({INSTALL_HINT}, which creates it)") from None


class LocalPostgres(Managed):
    """A PostgreSQL server on a free 127.0.0.1 port, in a temp dir, with a random password.

    The cluster has one superuser (:attr:`user`) with a generated password (scram-sha-256,
    never printed or logged) and one database (:attr:`database`). ``fsync`` stays on, as in
    production, so a commit is as durable as on a real server.

    Args:
        bin_dir: where ``initdb`` and ``postgres`` are (default: :func:`find_postgres_bin`).
        port: TCP port (default: a free one).
        start_timeout_s: how long :meth:`start` waits for a connection to succeed.
    """

    def __init__(self, *, bin_dir: Path | str | None = None, port: int | None = None,
                 start_timeout_s: float = 60.0) -> None:
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.host = LOOPBACK
        self.port = port or free_port()
        self.user = "fleet"
        self.database = "fleet"
        self.password = secrets.token_urlsafe(18)
        self.start_timeout_s = start_timeout_s
        self.dir: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def __repr__(self) -> str:
        return f"LocalPostgres({redact_url(self.url)})"

    @property
    def url(self) -> str:
        """``postgresql://fleet:PASSWORD@127.0.0.1:PORT/fleet``."""
        return (f"postgresql://{quote(self.user, safe='')}:{quote(self.password, safe='')}"
                f"@{self.host}:{self.port}/{self.database}")

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        return self.dir / "postgres.log" if self.dir else None

    def _popen_kwargs(self) -> dict:
        """Run as ``postgres`` when root; cwd in our dir (the user may not see the current
        one); no PG* variables of ours leak into the server's environment."""
        assert self.dir is not None
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update({"LC_ALL": "C", "TZ": "UTC"})
        kwargs: dict = {"cwd": self.dir, "env": env, "stdin": subprocess.DEVNULL}
        account = _run_as()
        if account is not None:
            kwargs.update(user=account.pw_uid, group=account.pw_gid, extra_groups=[])
            env["HOME"] = str(self.dir)
        return kwargs

    def _initdb(self) -> None:
        assert self.dir is not None and self.bin_dir is not None
        account = _run_as()
        pwfile = self.dir / "pwfile"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if account is not None:
            for path in (self.dir, pwfile):
                os.chown(path, account.pw_uid, account.pw_gid)
        cmd = [str(self.bin_dir / "initdb"), "-D", str(self.dir / "data"), "-U", self.user,
               f"--pwfile={pwfile}", "--auth=scram-sha-256", "--encoding=UTF8", "--no-locale",
               "--no-sync"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                                    **self._popen_kwargs())
        finally:
            pwfile.unlink(missing_ok=True)
        if result.returncode != 0:
            raise ServicesUnavailable(f"initdb failed ({result.returncode}): "
                                      f"{(result.stderr or result.stdout).strip()[-2000:]}")

    def start(self) -> LocalPostgres:
        """initdb, start the server, wait until it accepts a login, create the database."""
        if self.running:
            raise RuntimeError(f"postgres on port {self.port} is already running")
        if self.bin_dir is None:
            self.bin_dir = find_postgres_bin()
        started_s = time.monotonic()
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-postgres-"))
        try:
            self._initdb()
            assert self.log_path is not None
            cmd = [str(self.bin_dir / "postgres"), "-D", str(self.dir / "data"),
                   "-p", str(self.port), "-c", f"listen_addresses={self.host}",
                   "-c", f"unix_socket_directories={self.dir}", "-c", "logging_collector=off",
                   "-c", "max_connections=100", "-c", "fsync=on"]
            with self.log_path.open("wb") as log:
                self._proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                              start_new_session=True, **self._popen_kwargs())
            self._wait_for_login()
            with psycopg.connect(self._url_for("postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.database)))
        except BaseException:
            self.stop()
            raise
        logger.info("postgres started at %s in %.1f s (dir %s)", redact_url(self.url),
                    time.monotonic() - started_s, self.dir)
        return self

    def _url_for(self, database: str) -> str:
        return self.url.rsplit("/", 1)[0] + "/" + database

    def _wait_for_login(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            if self._proc.poll() is not None:
                raise ServicesUnavailable(f"postgres exited with {self._proc.returncode}:\n"
                                          f"{tail(self.log_path) if self.log_path else ''}")
            try:
                psycopg.connect(self._url_for("postgres"), connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise ServicesUnavailable(
                        f"postgres did not accept a login within {self.start_timeout_s} s: "
                        f"{exc}\n{tail(self.log_path) if self.log_path else ''}") from None
            time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then kill the process group; delete the dir. Idempotent."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    os.kill(self._proc.pid, signal.SIGINT)
                    self._proc.wait(timeout=30)
                except ProcessLookupError:
                    logger.debug("postgres %d was already gone", self._proc.pid)
                except subprocess.TimeoutExpired:
                    logger.warning("postgres %d ignored a fast shutdown", self._proc.pid)
            terminate_group(self._proc, timeout_s=10)
            self._proc = None
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


@dataclass
class PostgresService:
    """What :func:`postgres_service` yields: the URL, where it came from (``"env"``,
    ``"docker"`` or ``"local"``) and the local server when one was started here."""

    url: str
    source: str
    local: LocalPostgres | None = None


def _check_login(url: str) -> None:
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.Error as exc:
        raise ServicesUnavailable(f"PostgreSQL at {redact_url(url)} refuses: {exc}") from None


def _start_container(stack: ExitStack) -> str | None:
    """A postgres container's URL, or None (and nothing left running) when that fails."""
    try:
        import docker.errors
        import requests.exceptions
        from testcontainers.community.postgres import PostgresContainer
        from testcontainers.core.exceptions import ContainerStartException
    except ImportError as exc:
        logger.debug("not using Docker: %s", exc)
        return None
    host = loopback_docker_host()
    if host is None:
        return None
    user, password, database = "fleet", secrets.token_urlsafe(18), "fleet"
    container = PostgresContainer(POSTGRES_IMAGE, username=user, password=password,
                                  dbname=database, driver=None)
    try:
        container.start()
    except (docker.errors.DockerException, requests.exceptions.RequestException,
            ContainerStartException, TimeoutError, OSError) as exc:
        logger.warning("Docker answered but postgres did not start (%s); "
                       "falling back to local binaries", exc)
        return None
    stack.callback(container.stop)
    port = container.get_exposed_port(container.port)
    return f"postgresql://{user}:{quote(password, safe='')}@{host}:{port}/{database}"


@contextmanager
def postgres_service(env: Mapping[str, str] | None = None) -> Iterator[PostgresService]:
    """PostgreSQL for tests: ``POSTGRES_URL``, else Docker, else the local binaries.

    Raises:
        ServicesUnavailable: (a RuntimeError) when none of them works.
    """
    source = os.environ if env is None else env
    with ExitStack() as stack:
        if source.get("POSTGRES_URL"):
            found = PostgresService(source["POSTGRES_URL"], "env")
            _check_login(found.url)
        elif _docker_engine_answers(source) and (url := _start_container(stack)):
            found = PostgresService(url, "docker")
        else:
            local = stack.enter_context(LocalPostgres())
            found = PostgresService(local.url, "local", local)
        logger.info("services: postgres=%s (%s)", redact_url(found.url), found.source)
        yield found


@contextmanager
def scratch_database(url: str) -> Iterator[str]:
    """A new, empty database on the server of ``url`` (whose user may CREATE DATABASE); its
    URL is yielded, and the database is dropped afterwards, connections or not."""
    name = f"test_{secrets.token_hex(6)}"
    parts = urlsplit(url)
    scratch = urlunsplit(parts._replace(path=f"/{name}"))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield scratch
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                         .format(sql.Identifier(name)))
