"""Local mode's kept settings (``scrape-fleet config``, ``up --set``/``--allow-network``) and
what the commands do when the local fleet is down: stop in a second, except ``export``, which
reads the files sink's parts. No servers: a fleet directory is made by hand (the real fleet's
down/up is in tests/ops/test_local_mode.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.core.errors import ConfigError
from common.ops.fleet_dir import CONNECTION_VARIABLES, FleetDir, Proc
from common.ops.fleet_settings import config_main, run_settings
from common.sink.files import FileSink
from common.sink.reader import Entry
from tests.helpers import REPO_ROOT


def _scrape_fleet(fleet: Path, *args: str, **popen) -> subprocess.CompletedProcess[str]:
    """``scrape-fleet ARGS`` with no connection variable set and ``fleet`` as the local fleet."""
    env = {k: v for k, v in os.environ.items() if k not in CONNECTION_VARIABLES}
    env.update(SCRAPE_FLEET_DIR=str(fleet), PYTHONPATH=str(REPO_ROOT), LOG_LEVEL="WARNING")
    return subprocess.run([sys.executable, "-m", "common.ops.console", *args], env=env,
                          cwd=fleet.parent, text=True, capture_output=True, timeout=60,
                          check=False, **popen)


def test_config_set_keeps_settings_that_config_show_lists_and_unset_removes(tmp_path, capsys):
    fleet = FleetDir(tmp_path / "fleet")
    config_main(None, ["set", "RATE_LIMIT=5/second", "CRAWL_ENABLED=true", "--dir",
                       str(fleet.path)])
    said = capsys.readouterr().out
    assert "RATE_LIMIT=5/second" in said and "takes effect at the next `scrape-fleet up`" in said
    assert fleet.read_settings() == {"RATE_LIMIT": "5/second", "CRAWL_ENABLED": "true"}
    assert oct(fleet.settings_file.stat().st_mode & 0o777) == "0o600"

    config_main(None, ["unset", "CRAWL_ENABLED", "--dir", str(fleet.path)])
    config_main(None, ["show", "--dir", str(fleet.path)])
    shown = capsys.readouterr().out
    assert "RATE_LIMIT=5/second" in shown and "CRAWL_ENABLED=false  (default)" in shown
    assert fleet.read_settings() == {"RATE_LIMIT": "5/second"}


@pytest.mark.parametrize(("argv", "named"), [
    (["set", "RATE_LIMT=5/second"], "RATE_LIMT is not a setting; did you mean RATE_LIMIT?"),
    (["set", "RATE_LIMIT=fast"], "RATE_LIMIT='fast' is invalid"),
    (["set", "FETCH_ALLOW_NETWORKS=127.0.0.0/33"], "FETCH_ALLOW_NETWORKS='127.0.0.0/33'"),
    (["set", "REDIS_URL=redis://127.0.0.1:6379/0"], "REDIS_URL is decided by local mode"),
    (["set", "CRAWL_ENABLED"], "expected KEY=VALUE, got 'CRAWL_ENABLED'"),
    (["unset", "NOPE"], "NOPE is not a setting"),
])
def test_config_refuses_an_unknown_name_or_a_bad_value_naming_it_and_writes_nothing(
        tmp_path, argv, named):
    fleet = FleetDir(tmp_path / "fleet")
    config_main(None, ["set", "RATE_LIMIT=5/second", "--dir", str(fleet.path)])
    with pytest.raises(ConfigError) as refused:
        config_main(None, [*argv, "--dir", str(fleet.path)])
    assert named in str(refused.value)
    assert fleet.read_settings() == {"RATE_LIMIT": "5/second"}


def test_a_bad_setting_exits_2_with_a_configuration_error_and_never_shows_a_password(tmp_path):
    result = _scrape_fleet(tmp_path / "fleet", "config", "set",
                           "POSTGRES_URL=mysql://user:hunter2@db.example/x")
    assert result.returncode == 2
    assert result.stderr.startswith("configuration error: POSTGRES_URL=")
    assert "hunter2" not in result.stderr + result.stdout


def test_up_runs_with_the_kept_settings_then_the_environment_then_set_then_allow_network():
    stored = {"RATE_LIMIT": "5/second", "FETCH_ALLOW_NETWORKS": "10.0.0.0/8",
              "CRAWL_ENABLED": "true"}
    environ = {"CRAWL_MAX_DEPTH": "4", "RATE_LIMIT": "7/second", "REDIS_URL": "redis://x",
               "WORKER_ID": "me"}
    values = run_settings(stored, environ, [("RATE_LIMIT", "9/second"), ("CRAWL_ENABLED", "")],
                          ["127.0.0.1/8", "10.0.0.0/8"])
    assert values == {"RATE_LIMIT": "9/second", "CRAWL_MAX_DEPTH": "4",
                      "FETCH_ALLOW_NETWORKS": "10.0.0.0/8,127.0.0.0/8"}
    with pytest.raises(ConfigError, match="FETCH_ALLOW_NETWORKS: --allow-network 'localhost'"):
        run_settings({}, {}, networks=["localhost"])


@pytest.mark.parametrize("cidr", ["0.0.0.0/0", "::/0", "8.8.8.0/24"])
def test_allow_network_takes_private_networks_only(cidr):
    assert run_settings({}, {}, networks=["192.168.1.0/24", "::1"]) == {
        "FETCH_ALLOW_NETWORKS": "192.168.1.0/24,::1/128"}
    with pytest.raises(ConfigError, match=f"--allow-network '{cidr}' holds public addresses"):
        run_settings({}, {}, networks=[cidr])


def test_commands_stop_within_a_second_when_the_local_fleet_is_down(tmp_path):
    fleet = FleetDir(tmp_path / "fleet")
    fleet.create()  # as `down` leaves it: the data, no fleet.env
    for command in (["status"], ["produce", "https://example.com/"], ["dlq", "list"],
                    ["export", "--follow"]):
        began = time.monotonic()
        result = _scrape_fleet(fleet.path, *command)
        assert time.monotonic() - began < 5, command  # an interpreter start, no retries
        assert result.returncode == 3, (command, result.stderr)
        assert result.stderr == "error: the local fleet is down: `scrape-fleet up`\n", command
    assert _scrape_fleet(fleet.path, "export", "--follow", "--help").returncode == 0


def test_a_fleet_env_left_by_a_crash_or_a_reboot_counts_as_down(tmp_path):
    fleet = FleetDir(tmp_path / "fleet")
    fleet.create()
    fleet.write_env({"REDIS_URL": "redis://:pw@127.0.0.1:9/0"})
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    dead = Proc.of("redis", gone.pid) if gone.poll() is None else Proc("redis", gone.pid, 1)
    gone.wait(10)
    fleet.write_state([dead, Proc.of("rabbitmq", os.getpid())])
    result = _scrape_fleet(fleet.path, "status")
    assert result.returncode == 3
    assert "the local fleet is partly down (redis not running)" in result.stderr


def test_export_reads_the_sinks_parts_while_the_local_fleet_is_down(tmp_path):
    fleet = FleetDir(tmp_path / "fleet")
    fleet.create()
    sink = FileSink(fleet.results, rotate_bytes=1 << 20, rotate_s=3600, name="files")
    sink.write([Entry("results", f"1700000000000-{n}", {"url": f"http://127.0.0.1:9/{n}"})
                for n in range(3)] + [Entry("failures", "1700000000001-0", {"url": "x"})])
    sink.close()
    result = _scrape_fleet(fleet.path, "export", "-o", str(tmp_path / "out.jsonl"))
    assert result.returncode == 0, result.stderr
    assert (f"export: from the files sink's parts in {fleet.results} alone, without Redis"
            in result.stderr)
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["url"] for line in lines] == [f"http://127.0.0.1:9/{n}"
                                                           for n in range(3)]


def test_a_reader_that_goes_away_ends_a_command_quietly(tmp_path):
    fleet = tmp_path / "fleet"
    env = {k: v for k, v in os.environ.items() if k not in CONNECTION_VARIABLES}
    env.update(SCRAPE_FLEET_DIR=str(fleet), PYTHONPATH=str(REPO_ROOT))
    # The read end is closed before the command writes: its first write fails with EPIPE.
    proc = subprocess.Popen([sys.executable, "-m", "common.ops.console", "config", "show"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(30) == 0, err
    assert err == ""  # no BrokenPipeError traceback, no "Exception ignored" at exit
