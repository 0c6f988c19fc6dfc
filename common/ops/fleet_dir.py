"""The directory of a local-mode fleet (``scrape-fleet up``): where its data, logs, connection
settings and process ids live between commands and between runs.

    DIR/fleet.env     the fleet's settings (mode 0600): RABBITMQ_URL, REDIS_URL,
                      RABBITMQ_MANAGEMENT_URL, SINK_DIR and every other setting set when
                      ``up`` ran (RATE_LIMIT, ROUTING_RULES...: producers and the status
                      view then agree with the workers); removed by ``down``
    DIR/state.json    what ``up`` started: name, pid and start time of each process
    DIR/rabbitmq/     the node (queues, messages, users, logs); node.json its name and user
    DIR/redis/        Redis's AOF and dump.rdb, redis.log
    DIR/results/      the files sink's gzip JSON Lines parts
    DIR/logs/         one log per worker, the sink's, RabbitMQ's console output

DIR is ``--dir``, else ``$SCRAPE_FLEET_DIR``, else ``$XDG_DATA_HOME/scrape-fleet``
(``~/.local/share/scrape-fleet``). A process is known by its pid *and* its start time
(``/proc/PID/stat``), so a pid the kernel gave to another process since is never signalled.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import time
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import asdict, dataclass
from pathlib import Path

#: Variables that choose the broker or Redis: when any is set, the environment decides and
#: the local fleet's fleet.env is not read.
CONNECTION_VARIABLES = ("RABBITMQ_URL", "RABBITMQ_URLS", "RABBITMQ_HOST", "RABBITMQ_PORT",
                        "REDIS_URL", "REDIS_SENTINELS", "REDIS_HOST", "REDIS_PORT")
#: What local mode decides for its processes whatever the environment says (one local node
#: each, the sink's directory); fleet.env holds local mode's values of these.
LOCAL_VARIABLES = (*CONNECTION_VARIABLES, "RABBITMQ_USER", "RABBITMQ_PASSWORD", "RABBITMQ_VHOST",
                   "RABBITMQ_MANAGEMENT_URL", "REDIS_DB", "REDIS_PASSWORD",
                   "REDIS_SENTINEL_MASTER", "REDIS_SENTINEL_PASSWORD", "REDIS_MIN_REPLICAS",
                   "SINK_DIR")
#: Settings of one process, not of the fleet: not written to fleet.env.
PER_PROCESS = ("WORKER_ID", "METRICS_PORT")
DIR_VARIABLE = "SCRAPE_FLEET_DIR"


def default_dir(environ: Mapping[str, str] | None = None) -> Path:
    """``$SCRAPE_FLEET_DIR``, else ``$XDG_DATA_HOME/scrape-fleet``, else
    ``~/.local/share/scrape-fleet``."""
    env = os.environ if environ is None else environ
    if env.get(DIR_VARIABLE):
        return Path(env[DIR_VARIABLE]).expanduser().resolve()
    data_home = env.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return (Path(data_home).expanduser() / "scrape-fleet").resolve()


@dataclass(frozen=True)
class Proc:
    """A process ``up`` started: its role, pid and kernel start time (clock ticks)."""

    name: str
    pid: int
    start: int

    @classmethod
    def of(cls, name: str, pid: int) -> Proc:
        start = start_time(pid)
        if start is None:
            raise ProcessLookupError(f"{name} (pid {pid}) exited at once")
        return cls(name, pid, start)

    @property
    def alive(self) -> bool:
        """Running (not a zombie) and still the same process."""
        return start_time(self.pid) == self.start

    def signal(self, signum: int, *, group: bool = False) -> None:
        """Send ``signum`` to the process (its process group with ``group``) if it is alive."""
        if self.alive:
            try:
                os.killpg(self.pid, signum) if group else os.kill(self.pid, signum)
            except ProcessLookupError:
                return

    def wait(self, timeout_s: float) -> bool:
        """Until the process is gone; False when it still runs after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.alive:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def stop(self, timeout_s: float, *, group: bool = False) -> bool:
        """SIGTERM, wait ``timeout_s``, then SIGKILL. True when it stopped on SIGTERM."""
        self.signal(signal.SIGTERM, group=group)
        if self.wait(timeout_s):
            return True
        self.signal(signal.SIGKILL, group=group)
        self.wait(10)
        return False


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` (field 22 of /proc/PID/stat), None when it is gone or a
    zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) "; comm may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


class FleetDir:
    """The paths of one local fleet's directory, and its two small files."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.env_file = path / "fleet.env"
        self.state_file = path / "state.json"
        self.rabbitmq = path / "rabbitmq"
        self.redis = path / "redis"
        self.results = path / "results"
        self.logs = path / "logs"

    def create(self) -> None:
        for directory in (self.path, self.rabbitmq, self.redis, self.results, self.logs):
            directory.mkdir(parents=True, exist_ok=True)
        self.path.chmod(0o700)  # credentials and data of this user only

    def write_env(self, values: Mapping[str, str]) -> None:
        """Write ``values`` as ``KEY='value'`` lines in POSIX shell quoting (mode 0600).

        Any value survives, newlines, quotes, ``#``, ``$`` and backslashes included: inside
        single quotes a shell and :meth:`read_env` take every character literally, and a
        ``'`` is written as ``'"'"'``. (python-dotenv turns a lone CR into LF; NOTES.)
        """
        for key in values:
            if not _ENV_NAME.fullmatch(key):
                raise ValueError(f"not a variable name: {key!r}")
        lines = [f"# scrape-fleet local mode in {self.path}: written by `scrape-fleet up`,",
                 "# removed by `scrape-fleet down`. Commands read it when no RABBITMQ_*/REDIS_*",
                 "# connection variable is set; a shell can `set -a; . THIS_FILE; set +a`."]
        lines += [f"{key}={_quote(value)}" for key, value in values.items()]
        _write_private(self.env_file, "\n".join(lines) + "\n")

    def read_env(self) -> dict[str, str]:
        """The variables of fleet.env ({} when there is none), exactly as written.

        Raises:
            ValueError: the file is not what :meth:`write_env` writes (edited by hand), naming
                the file but no value (values hold passwords).
        """
        try:
            with self.env_file.open(encoding="utf-8", newline="") as handle:
                text = handle.read()  # newline="": a CR inside a value stays a CR
        except FileNotFoundError:
            return {}
        # The whole file at once, as a shell reads it: a quoted value may span lines.
        lexer = shlex.shlex(text, posix=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        values = {}
        try:
            for word in lexer:
                key, equals, value = word.partition("=")
                if not equals or not _ENV_NAME.fullmatch(key):
                    raise ValueError("a word is not KEY=VALUE")
                values[key] = value
        except ValueError as exc:
            raise ValueError(f"{self.env_file} is malformed ({exc}): remove it, or "
                             "`scrape-fleet down` and `up` again") from None
        return values

    def write_state(self, procs: Iterable[Proc], **extra: object) -> None:
        state = {"processes": [asdict(p) for p in procs], **extra}
        _write_private(self.state_file, json.dumps(state, indent=1) + "\n")

    def read_state(self) -> tuple[list[Proc], dict[str, object]]:
        """The processes ``up`` recorded and the rest of state.json (([], {}) when none)."""
        try:
            state = json.loads(self.state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return [], {}
        procs = [Proc(**p) for p in state.pop("processes", [])]
        return procs, state

    def clear(self) -> None:
        """Forget the running fleet (the data stays)."""
        for path in (self.env_file, self.state_file):
            path.unlink(missing_ok=True)


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _quote(value: str) -> str:
    """``value`` in single quotes for a POSIX shell (always quoted: an empty value too)."""
    return "'" + value.replace("'", "'\"'\"'") + "'"


def write_private(path: Path, text: str) -> Path:
    """Write ``text`` to ``path``, readable by this user only from its first byte (created
    0600, never widened: a leftover file of that name, whatever its mode, is replaced).
    Written byte for byte (``newline=""``: CRs inside values are kept)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
        handle.write(text)
    return path


def _write_private(path: Path, text: str) -> None:
    """:func:`write_private`, replacing ``path`` atomically (readers never see half a file)."""
    os.replace(write_private(path.with_name(path.name + ".tmp"), text), path)


def use_local_fleet(environ: MutableMapping[str, str]) -> Path | None:
    """Point the commands at the local fleet: when no connection variable is set and the
    fleet directory has a fleet.env, its variables go into ``environ`` (set ones win).

    Returns:
        The fleet directory when its settings were used, else None.
    """
    if any(environ.get(name) for name in CONNECTION_VARIABLES):
        return None
    fleet = FleetDir(default_dir(environ))
    values = fleet.read_env()
    for key, value in values.items():
        environ.setdefault(key, value)
    return fleet.path if values else None
