"""Local mode (``scrape-fleet up``/``down``) on real RabbitMQ and Redis binaries: no password
or Erlang cookie is ever on a command line (``/proc/PID/cmdline`` is readable by every local
user), every file holding one is this user's only (0600), and a multi-line setting with quotes,
``#``, ``$`` and backslashes neither stops ``up`` nor ``down``.

One fleet for the module (RabbitMQ takes 5-20 s to start), ``up`` and ``down`` each run under
``strace -f -e trace=execve``: every command line any of their processes (servers, workers,
rabbitmqctl, the Erlang VM and its helpers) ever had is in the trace, for the fleet's whole
life. Polling /proc instead misses redis-server's: it rewrites its command line about 10 ms
after exec, and on a busy two-core machine a poller is not scheduled that often.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from common.ops.fleet_dir import CONNECTION_VARIABLES, FleetDir
from common.ops.servers import ServicesUnavailable, find_binaries, redis_config_string
from tests.helpers import REPO_ROOT
from tests.ops.test_fleet_env import HOSTILE

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RULES = HOSTILE["EXTRACT_RULES"]  # inline JSON over four lines, with ' " # $ = and \
UP_TIMEOUT_S = 300.0


def _traced(trace: Path, fleet: FleetDir, *args: str) -> list[str]:
    """``scrape-fleet ARGS --dir FLEET`` under strace: every execve of it and its descendants,
    whole (``-s``), in ``trace``. Only execve stops a tracee (``--seccomp-bpf``)."""
    strace = shutil.which("strace")
    assert strace
    return [strace, "-f", "-q", "--seccomp-bpf", "-e", "trace=execve", "-e", "signal=none",
            "-s", "1000000", "-o", str(trace), "--",
            sys.executable, "-m", "common.ops.console", *args, "--dir", str(fleet.path)]


def _exit_code(trace: Path, timeout_s: float) -> int | None:
    """The exit code of the first process in ``trace`` (the command), once it exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        lines = trace.read_text(errors="replace").splitlines() if trace.exists() else []
        if lines:
            pid = lines[0].split()[0]
            for words in map(str.split, lines):  # "PID  +++ exited with 0 +++"
                if words[:4] == [pid, "+++", "exited", "with"]:
                    return int(words[4])
                if words[:3] == [pid, "+++", "killed"]:
                    return -1
        time.sleep(0.2)
    return None


@pytest.fixture(scope="module")
def local_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``up`` with 1 worker and the multi-line EXTRACT_RULES, traced until the fleet is gone;
    the test named ``..._down_...`` stops it (the teardown again, in case it did not run)."""
    missing = pytest.fail if os.environ.get("CI") else pytest.skip  # CI: an error, never a skip
    try:
        find_binaries()
    except ServicesUnavailable as exc:
        missing(str(exc))
    if shutil.which("strace") is None:
        missing("strace is not installed (scripts/bootstrap.sh installs it)")
    root = tmp_path_factory.mktemp("local-secrets")
    fleet = FleetDir(root / "fleet")
    env = {k: v for k, v in os.environ.items() if k not in CONNECTION_VARIABLES}
    env.update(EXTRACT_RULES=RULES, LOG_LEVEL="WARNING", PYTHONPATH=str(REPO_ROOT))
    up_out = root / "up.out"
    with up_out.open("w") as out:
        # The tracer lives as long as the fleet: it ends when the last traced process does.
        tracer = subprocess.Popen(_traced(root / "up.trace", fleet, "up", "--workers", "1",
                                          "--any-port"),
                                  cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                  stderr=subprocess.STDOUT)
    state = {"fleet": fleet, "env": env, "root": root,
             "up_code": _exit_code(root / "up.trace", UP_TIMEOUT_S),
             "up_out": up_out.read_text(errors="replace"), "traces": [root / "up.trace"]}
    if state["up_code"] == 0:
        state["secrets"] = _secrets(fleet)  # fleet.env goes at down
    try:
        yield state
    finally:
        if fleet.state_file.exists():
            _down(state)
        if fleet.state_file.exists():  # down failed: stop what up started, by pid
            for proc in fleet.read_state()[0]:
                proc.stop(10, group=True)
        try:
            tracer.wait(60)
        except subprocess.TimeoutExpired:
            tracer.send_signal(signal.SIGKILL)
            tracer.wait(10)


def _down(local_fleet: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    trace = local_fleet["root"] / "down.trace"
    local_fleet["traces"].append(trace)
    return subprocess.run(_traced(trace, local_fleet["fleet"], "down", "--timeout", "60"),
                          cwd=local_fleet["root"], env=local_fleet["env"], text=True,
                          capture_output=True, timeout=300, check=False)


def _up(local_fleet: dict[str, Any]) -> FleetDir:
    """The fleet, after checking that ``up`` succeeded."""
    assert local_fleet["up_code"] == 0, local_fleet["up_out"]
    return local_fleet["fleet"]


def _secrets(fleet: FleetDir) -> dict[str, str]:
    node = json.loads((fleet.rabbitmq / "node.json").read_text(encoding="utf-8"))
    redis_url = fleet.read_env()["REDIS_URL"]
    return {"redis password": unquote(urlsplit(redis_url).password or ""),
            "rabbitmq password": node["password"],
            "erlang cookie": (fleet.rabbitmq / ".erlang.cookie").read_text().strip()}


def test_up_starts_the_fleet_with_a_multi_line_setting_and_keeps_it_unchanged(local_fleet):
    fleet = _up(local_fleet)
    assert "scrape-fleet is up: 1 workers" in local_fleet["up_out"]
    assert fleet.read_env()["EXTRACT_RULES"] == RULES


def test_every_file_holding_a_secret_is_readable_by_its_owner_only(local_fleet):
    fleet = _up(local_fleet)
    # As written or as Redis's config file spells it (every byte but letters and digits escaped).
    forms = [form for secret in local_fleet["secrets"].values()
             for form in (secret.encode(), redis_config_string(secret).encode())]
    holders = [path for path in fleet.path.rglob("*")
               if path.is_file() and not path.is_symlink()
               and any(form in path.read_bytes() for form in forms)]
    assert fleet.env_file in holders and fleet.rabbitmq / "node.json" in holders
    assert any(p.parent == fleet.redis for p in holders)  # Redis's password file
    modes = {str(p.relative_to(fleet.path)): oct(p.stat().st_mode & 0o077) for p in holders}
    assert modes == {name: "0o0" for name in modes}


def test_down_stops_every_process_with_the_multi_line_setting_in_fleet_env(local_fleet):
    fleet = _up(local_fleet)
    procs, _state = fleet.read_state()
    down = _down(local_fleet)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "redis: saved and stopped" in down.stdout and "rabbitmq: stopped" in down.stdout
    assert procs and not [p.name for p in procs if p.alive]
    assert not fleet.env_file.exists()


def test_no_process_ever_has_a_password_or_the_cookie_on_its_command_line(local_fleet):
    fleet = _up(local_fleet)
    secrets = local_fleet["secrets"]
    if fleet.state_file.exists():
        down = _down(local_fleet)  # down's rabbitmqctl and redis calls are traced too
        assert down.returncode == 0, down.stdout + down.stderr
    execs = [line for trace in local_fleet["traces"]
             for line in trace.read_text(errors="replace").splitlines() if " execve(" in line]
    assert any("redis-server" in line for line in execs)
    assert any("rabbitmqctl" in line for line in execs) and any("beam" in line for line in execs)
    found = {name: [line for line in execs if secret in line] for name, secret in secrets.items()}
    assert found == {name: [] for name in found}
