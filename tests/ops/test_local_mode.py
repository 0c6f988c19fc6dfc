"""A newcomer's five minutes, as one test: ``pip install`` the package into a fresh venv, then
``scrape-fleet --help``, a setting kept with ``config set``, ``up`` with 2 workers and the
loopback test site allowed (``--allow-network``) and crawl mode on (``--set``), a URL file
naming the site's home page, which links to itself and to 300 pages that link back to it: the
site crawled, every page one result and one fetch (the site's log), the seed included;
``status`` with progress adding up, a rate and an ETA, then to do 0; ``export`` to JSON Lines,
``down``; then, with the fleet
down, ``status`` failing at once and ``export`` reading the sink's files; a plain ``up`` that
runs with the same settings, and nothing left running after the last ``down``. Then the
pieces it rests on, without servers.

The venv is built once per session in a temp dir on the oldest supported Python (Debian 12's
/usr/bin/python3), the way the README says: ``pip install .`` of a copy of only what the package
needs (pyproject.toml, README.md, requirements*, common/), so nothing is reached from the
checkout: not the root scripts, not devtools. It runs from another directory, without
PYTHONPATH. (tests/test_oldest_python.py installs the hash-checked lock there.)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from common.ops.console import COMMANDS
from common.ops.fleet_dir import CONNECTION_VARIABLES, FleetDir, Proc, start_time, use_local_fleet
from common.ops.local_api import health_url, is_healthy
from common.ops.servers import STABLE_PORTS, free_port, pick_port
from devtools.testsite import TestSite
from tests.helpers import REPO_ROOT, wait_for

PAGES = 300


def _pip(venv: Path, *args: str) -> None:
    result = subprocess.run([str(venv / "bin" / "pip"), "--disable-pip-version-check", "-q",
                             *args], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def _oldest_python() -> str:
    """Debian 12's /usr/bin/python3 (3.11.2, the oldest Python the project supports), else the
    suite's own (tests/test_oldest_python.py fails under CI when /usr/bin/python3 cannot serve)."""
    system = Path("/usr/bin/python3")
    if system.exists() and subprocess.run(
            [str(system), "-c", "import sys, venv; sys.exit(sys.version_info < (3, 11))"],
            capture_output=True, timeout=60, check=False).returncode == 0:
        return str(system)
    return sys.executable


@pytest.fixture(scope="session")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv on the oldest supported Python with README's ``pip install .`` of a copy of the
    package, built once per session."""
    root = tmp_path_factory.mktemp("newcomer")
    source = root / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "requirements.txt", "requirements.lock"):
        shutil.copy2(REPO_ROOT / name, source / name)
    for package in ("scrape_fleet", "common"):
        shutil.copytree(REPO_ROOT / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    venv = root / "venv"
    subprocess.run([_oldest_python(), "-m", "venv", str(venv)], check=True, timeout=120)
    _pip(venv, "install", str(source))
    return venv


def _processes_naming(text: str) -> list[str]:
    """Command lines of the live (not zombie) processes that mention ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline and start_time(int(proc.name)) is not None:
            found.append(f"{proc.name}: {cmdline}")
    return found


@pytest.mark.integration
@pytest.mark.slow
def test_a_newcomer_installs_starts_crawls_a_url_file_watches_exports_and_stops(
        fresh_venv: Path, tmp_path: Path):
    fleet_dir, work = tmp_path / "fleet", tmp_path / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in (*CONNECTION_VARIABLES, "PYTHONPATH", "VIRTUAL_ENV")}
    for name in ("FETCH_ALLOW_NETWORKS", "RATE_LIMIT"):  # from config and up's flags only
        env.pop(name, None)
    env.update(SCRAPE_FLEET_DIR=str(fleet_dir), LOG_LEVEL="WARNING",
               PATH=f"{fresh_venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")

    def fleet(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["scrape-fleet", *args], cwd=work, env=env, text=True,
                              capture_output=True, timeout=timeout_s, check=False)

    overview = fleet("--help")
    assert overview.returncode == 0 and all(name in overview.stdout for name in COMMANDS)
    helps = {name: subprocess.Popen(["scrape-fleet", name, "--help"], cwd=work, env=env,
                                    text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for name in COMMANDS}  # at once: each is an interpreter start-up, mostly waiting
    for name, proc in helps.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and f"usage: scrape-fleet {name}" in out, err

    def unread(*args: str) -> tuple[int, str]:
        """``scrape-fleet ARGS | head`` at its worst: the reader is gone before any output."""
        proc = subprocess.Popen(["scrape-fleet", *args], cwd=work, env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        return proc.wait(120), proc.stderr.read()

    kept = fleet("config", "set", "RATE_LIMIT=40/second")
    assert kept.returncode == 0 and "takes effect at the next `scrape-fleet up`" in kept.stdout
    site = TestSite(pages=PAGES).start()
    seed = site.url("/")
    # The seed links to itself and to every page; every page links back to it (``Index``).
    home = "\n".join([f'<a href="{seed}">Home</a>'] + [
        f'<a href="/page/{n}">Page {n}</a>' for n in range(1, PAGES + 1)])
    site.route("/", lambda _record: (200, {"Content-Type": "text/html; charset=utf-8"},
                                     f"<html><head><title>Home</title></head><body>{home}"
                                     "</body></html>".encode()))
    pages = {seed, *(site.page_url(n) for n in range(1, PAGES + 1))}
    (work / "urls.txt").write_text(f"# my site\n\n{seed}\n", encoding="utf-8")
    procs: list = []
    try:
        up = fleet("up", "--workers", "2", "--media", "1", "--any-port", "--allow-network",
                   "127.0.0.0/8", "--set", "CRAWL_ENABLED=true", timeout_s=300)
        procs, _state = FleetDir(fleet_dir).read_state()
        assert up.returncode == 0, up.stdout + up.stderr
        assert "RabbitMQ management UI: http://localhost:" in up.stdout and "password" in up.stdout
        management = FleetDir(fleet_dir).read_env()["RABBITMQ_MANAGEMENT_URL"]
        assert unquote(urlsplit(management).password) not in up.stdout  # never printed
        assert "scrape-fleet produce -f urls.txt" in up.stdout
        settings = ("  RATE_LIMIT=40/second\n", "  FETCH_ALLOW_NETWORKS=127.0.0.0/8\n",
                    "  CRAWL_ENABLED=true\n", "  CRAWL_MAX_DEPTH=2  (default)\n")
        assert all(line in up.stdout for line in settings), up.stdout
        assert "kept from the environment for the next runs: LOG_LEVEL " in up.stdout
        assert unread("up") == (0, "")  # already up: it prints where everything is
        assert sorted(p.name for p in procs) == ["api", "rabbitmq", "redis", "scheduler",
                                                 "sink", "worker-1", "worker-2",
                                                 "worker-media-1"]
        assert f"1 download workers (assets in {fleet_dir / 'media'})" in up.stdout
        assert all(p.alive for p in procs)
        api_port = FleetDir(fleet_dir).read_state()[1]["api_port"]
        assert f"  control plane: http://127.0.0.1:{api_port}/  (web UI" in up.stdout
        assert "a user for the UI: scrape-fleet api user add me --scope admin" in up.stdout
        assert is_healthy(f"http://127.0.0.1:{api_port}/api/health")

        produced = fleet("produce", "-f", "urls.txt")
        assert produced.returncode == 0 and "new=1 " in produced.stdout, produced.stderr

        def progress() -> dict:
            status = fleet("status", "--json")
            assert status.returncode == 0, status.stderr
            now = json.loads(status.stdout)["progress"]
            parts = now["done"] + now["failed"] + now["to_do"] + now["other"]
            assert parts == now["total"] and now["failed"] == 0, now
            return now

        assert wait_for(lambda: progress()["done"] >= 40, 60, step_s=0.5)
        midway = progress()  # 40/second: ~7 s for the site, so still running
        assert midway["to_do"] > 0 and midway["total"] > midway["done"], midway
        assert midway["outcomes_per_s"] > 0 and midway["eta_s"] > 0, midway
        table = fleet("status").stdout
        assert "progress: " in table and " done (" in table and "| ETA " in table, table
        assert unread("status") == (0, "")

        def finished() -> bool:
            now = progress()
            return now["done"] == len(pages) and now["to_do"] == 0

        assert wait_for(finished, 120, step_s=1.0)
        assert progress()["total"] == len(pages)
        exported = fleet("export", "-o", "results.jsonl")
        assert exported.returncode == 0, exported.stderr
        assert "export: from the files sink's parts in " in exported.stderr
        lines = (work / "results.jsonl").read_text(encoding="utf-8").splitlines()
        records = [json.loads(line) for line in lines]
        assert sorted(r["url"] for r in records) == sorted(pages)  # one result each
        assert all(r["status"] == 200 and r["id"] for r in records)
        fetches = Counter(r.path for r in site.log if r.path != "/robots.txt")
        assert fetches == Counter({urlsplit(url).path: 1 for url in pages}), \
            [path for path, n in fetches.items() if n != 1]  # each fetched once, the seed too

        stopped = fleet("down", timeout_s=300)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        began = time.monotonic()
        down_status = fleet("status")
        assert time.monotonic() - began < 5 and down_status.returncode == 3
        assert "the local fleet is down: `scrape-fleet up`" in down_status.stderr
        offline = fleet("export", "-o", "offline.jsonl")
        assert offline.returncode == 0, offline.stderr
        assert "alone, without Redis" in offline.stderr
        assert (work / "offline.jsonl").read_text(encoding="utf-8").splitlines() == lines

        again = fleet("up", "--workers", "1", "--any-port", timeout_s=300)
        procs, _state = FleetDir(fleet_dir).read_state()
        assert again.returncode == 0, again.stdout + again.stderr
        assert "  RATE_LIMIT=40/second\n" in again.stdout
        assert "  FETCH_ALLOW_NETWORKS=127.0.0.0/8\n" in again.stdout
        assert "kept from the environment" not in again.stdout  # LOG_LEVEL: kept already
        assert "  CRAWL_ENABLED=true\n" in again.stdout
        last = site.url("/latin1")
        assert fleet("produce", last).returncode == 0

        def fetched() -> bool:  # a result, not a fetch_blocked dead letter: still allowed
            return last in fleet("export").stdout

        assert wait_for(fetched, 60, step_s=1.0)
        assert site.count("/latin1") == 1 and site.count("/") == 1
    finally:
        down = fleet("down", timeout_s=300)
        site.stop()
    assert down.returncode == 0, down.stdout + down.stderr
    assert "workers: 1 of 1 finished their work and stopped" in down.stdout
    assert "redis: saved and stopped" in down.stdout and "rabbitmq: stopped" in down.stdout
    assert procs and not [p for p in procs if p.alive]
    assert not _processes_naming(str(fleet_dir))
    assert not (fleet_dir / "fleet.env").exists()
    assert list((fleet_dir / "results").glob("results-*.jsonl.gz"))  # the sink's files stay


# -- the pieces, without servers ---------------------------------------------------------------

def test_commands_use_the_local_fleets_settings_unless_a_connection_variable_is_set(tmp_path):
    fleet = FleetDir(tmp_path)
    fleet.create()
    fleet.write_env({"RABBITMQ_URL": "amqp://u:p@127.0.0.1:5999/%2F", "RATE_LIMIT": "5/second",
                     "SINK_DIR": str(tmp_path / "with space")})
    me = Proc.of("rabbitmq", os.getpid())  # any live process: the check is by pid
    fleet.write_state([me, Proc("redis", me.pid, me.start)])
    assert oct(fleet.env_file.stat().st_mode & 0o777) == "0o600"

    environ = {"SCRAPE_FLEET_DIR": str(tmp_path), "RATE_LIMIT": "1/second"}
    assert use_local_fleet(environ) == tmp_path
    assert environ["RABBITMQ_URL"] == "amqp://u:p@127.0.0.1:5999/%2F"
    assert environ["RATE_LIMIT"] == "1/second"  # set by hand: it wins
    assert environ["SINK_DIR"] == str(tmp_path / "with space")

    elsewhere = {"SCRAPE_FLEET_DIR": str(tmp_path), "REDIS_HOST": "127.0.0.1"}
    assert use_local_fleet(elsewhere) is None and "RABBITMQ_URL" not in elsewhere


def test_a_port_in_use_gives_way_to_a_free_one():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert pick_port(taken) != taken
    free = pick_port(None)
    assert pick_port(free) == free and pick_port(free, taken=(free,)) != free


def test_a_free_port_is_drawn_below_the_ephemeral_range_so_no_connection_takes_it_meanwhile():
    # A broker stopped and started on its port must find it free: outgoing connections take
    # their local ports from the ephemeral range, never from below it.
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(20)}
    assert all(low - STABLE_PORTS <= port < low for port in ports), (low, ports)
    assert len(ports) > 10  # drawn, not one port over and over
    with socket.socket() as busy:  # and free indeed
        busy.bind(("127.0.0.1", ports.pop()))


def test_a_process_is_known_by_its_pid_and_start_time_so_a_reused_pid_is_not_signalled():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        proc = Proc.of("child", child.pid)
        assert proc.alive
        assert not Proc("child", child.pid, proc.start + 1).alive  # another process, same pid
        assert proc.stop(5)
        child.wait(5)
        assert not proc.alive
    finally:
        child.kill()
        child.wait(5)


def test_the_control_plane_is_asked_on_loopback_when_it_listens_on_every_address():
    assert health_url({}, 8000) == "http://127.0.0.1:8000/api/health"  # API_HOST's default
    assert health_url({"API_HOST": "0.0.0.0"}, 8123) == "http://127.0.0.1:8123/api/health"
    assert health_url({"API_HOST": "::"}, 8123) == "http://[::1]:8123/api/health"
    assert health_url({"API_HOST": "10.1.2.3"}, 80) == "http://10.1.2.3:80/api/health"
    with socket.socket() as sock:  # a port nobody answers on: not healthy, no exception
        sock.bind(("127.0.0.1", 0))
        assert not is_healthy(f"http://127.0.0.1:{sock.getsockname()[1]}/api/health")
