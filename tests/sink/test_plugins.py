"""Sinks pluggable by name: a user's sink class (tests/sink/user_sinks.py) run by
``scrape-fleet sink`` through ``SINK=package.module:Class`` or an entry point of an installed
distribution, against the real Redis streams; a kind that is wrong stops with exit 2 and says
why; a sink whose write fails or that is killed mid-batch loses nothing."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import redis

from common.core.config import Settings, load_settings
from common.core.errors import ConfigError
from common.ops.cli_run import sink_class
from common.sink.plugins import BUILT_IN, build, known_names, resolve
from common.store.keys import FAILURES_STREAM, RESULTS_STREAM, SINKS, sink_group
from common.store.results import ResultStore
from scrape_fleet.sinks import ENTRY_POINT_GROUP, Entry, Sink
from tests.helpers import REPO_ROOT, TEST_ENV, wait_for
from tests.sink.parts import stream_ids
from tests.sink.user_sinks import FILE_NAME, JsonLinesSink, read_lines

USER_SINK = "tests.sink.user_sinks:JsonLinesSink"
GROUP = sink_group("jsonl")


def _fill(client: redis.Redis, results: int, failures: int) -> dict[tuple[str, str], dict]:
    """Append records to both streams; (stream, id) -> record of everything in them."""
    store = ResultStore(client, 1_000_000)
    for n in range(results):
        store.record({"url": f"https://example.test/page/{n}", "n": n})
    for n in range(failures):
        store.record_failure({"url": f"https://example.test/gone/{n}", "outcome": "dead_letter",
                              "reason": "http_404"}, None)
    return stream_ids(client)


def _written(directory: Path) -> list[tuple[str, str]]:
    return [(line["stream"], line["id"]) for line in read_lines(directory / FILE_NAME)]


def _pending(client: redis.Redis) -> set[tuple[str, str]]:
    return {(stream, p["message_id"].decode())
            for stream in (RESULTS_STREAM, FAILURES_STREAM)
            for p in client.xpending_range(stream, GROUP, min="-", max="+", count=1000)}


def _assert_all_written_acknowledged_and_trimmed(client: redis.Redis, directory: Path,
                                                 expected: dict) -> None:
    written = _written(directory)
    assert sorted(written) == sorted(expected), "every entry exactly once"
    assert [line["url"] for line in read_lines(directory / FILE_NAME)] == [
        expected[key]["url"] for key in written]
    assert _pending(client) == set()
    assert client.xlen(RESULTS_STREAM) == client.xlen(FAILURES_STREAM) == 0, "trimmed"


def _sink_process(settings: Settings, log: Path, *args: str,
                  env: dict[str, str]) -> subprocess.Popen:
    """``scrape-fleet sink ARGS`` in the background, its output in ``log``."""
    full = dict(os.environ, **TEST_ENV, **env, REDIS_URL=settings.redis_url,
                RABBITMQ_URL=settings.rabbitmq_url, PYTHONUNBUFFERED="1")
    with log.open("w") as out:
        return subprocess.Popen([sys.executable, "-m", "common.ops.console", "sink", *args],
                                cwd=REPO_ROOT, env=full, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)


def _fake_distribution(site: Path, name: str, entries: dict[str, str]) -> None:
    """An installed distribution as importlib.metadata finds it: a dist-info directory with
    entry points under scrape_fleet.sinks."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()))


def test_the_built_in_names_are_the_entry_points_pyproject_registers():
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"][ENTRY_POINT_GROUP] == BUILT_IN
    for kind in BUILT_IN:
        assert issubclass(resolve(kind, "test").cls, Sink)


def test_a_user_sink_named_by_sink_writes_acknowledges_and_trims_every_entry(
        settings, redis_client, run_cli, tmp_path):
    expected = _fill(redis_client, results=7, failures=2)

    done = run_cli("-m", "common.ops.console", "sink", "--dir", str(tmp_path), "--idle-exit",
                   "1", env={"SINK": USER_SINK, "SINK_BATCH": "3"})

    assert done.returncode == 0, done.stderr[-3000:]
    _assert_all_written_acknowledged_and_trimmed(redis_client, tmp_path, expected)
    # The class's name attribute is its registered name: its group, and what retire takes.
    assert redis_client.smembers(SINKS) == {b"jsonl"}
    assert "9 entries written and acknowledged" in done.stderr


def test_a_sink_registered_by_an_installed_distribution_runs_by_its_name(
        settings, redis_client, run_cli, tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "jsonl_sink", {"jsonl": USER_SINK})
    expected = _fill(redis_client, results=3, failures=1)
    env = {"PYTHONPATH": f"{site}:{REPO_ROOT}"}

    done = run_cli("sink.py", "jsonl", "--dir", str(tmp_path / "out"), "--idle-exit", "1",
                   env=env)
    unknown = run_cli("sink.py", "jsnol", env=env)

    assert done.returncode == 0, done.stderr[-3000:]
    _assert_all_written_acknowledged_and_trimmed(redis_client, tmp_path / "out", expected)
    assert unknown.returncode == 2
    assert ("configuration error: sink kind 'jsnol': no sink named 'jsnol' (known: files, "
            "jsonl, postgres; or package.module:Class)") in unknown.stderr


def test_a_sink_that_cannot_be_loaded_stops_with_exit_2_naming_sink_and_registers_nothing(
        redis_client, run_cli):
    missing = run_cli("-m", "common.ops.console", "sink",
                      env={"SINK": "tests.sink.no_such_module:Sink"})

    assert missing.returncode == 2
    assert ("configuration error: SINK='tests.sink.no_such_module:Sink': cannot import module "
            "'tests.sink.no_such_module'") in missing.stderr
    assert "Traceback" not in missing.stderr
    assert redis_client.smembers(SINKS) == set()


@pytest.mark.parametrize(("kind", "message"), [
    ("nosuch", "no sink named 'nosuch' (known: files, postgres; or package.module:Class)"),
    ("tests.sink.no_such_module:Sink", "cannot import module 'tests.sink.no_such_module': "
                                       "ModuleNotFoundError: No module named "
                                       "'tests.sink.no_such_module'"),
    ("tests.sink.user_sinks:Missing", "module 'tests.sink.user_sinks' has no attribute "
                                      "'Missing'"),
    ("tests.sink.user_sinks:NotASink", "tests.sink.user_sinks.NotASink is not a sink: no write "
                                       "method; subclass scrape_fleet.Sink"),
    ("tests.sink.user_sinks:HalfDone", "HalfDone does not implement write"),
    ("tests.sink.user_sinks:read_lines", "names a function, not a class"),
    (":JsonLinesSink", "expected package.module:Class, got ':JsonLinesSink'"),
])
def test_a_kind_that_names_no_sink_class_is_a_config_error_saying_what_is_wrong(kind, message):
    with pytest.raises(ConfigError) as caught:
        resolve(kind, f"SINK={kind!r}")
    assert str(caught.value).startswith(f"SINK={kind!r}: {message}")


def test_a_sink_module_that_fails_while_importing_is_a_config_error(tmp_path, monkeypatch):
    (tmp_path / "exploding_sink.py").write_text("raise RuntimeError('no API key')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"^SINK='exploding_sink:S': importing module "
                                          r"'exploding_sink' failed: RuntimeError: no API key$"):
        resolve("exploding_sink:S", "SINK='exploding_sink:S'")


def test_a_name_two_distributions_register_differently_is_refused(tmp_path, monkeypatch):
    _fake_distribution(tmp_path, "one_sink", {"jsonl": USER_SINK})
    _fake_distribution(tmp_path, "other_sink", {"jsonl": "other.module:Sink"})
    monkeypatch.syspath_prepend(str(tmp_path))
    assert known_names() == ["files", "jsonl", "postgres"]
    with pytest.raises(ConfigError, match="registered more than once under scrape_fleet.sinks "
                                          r"\(other.module:Sink, tests.sink.user_sinks"):
        resolve("jsonl", "SINK='jsonl'")


def test_the_kind_comes_from_the_command_line_then_sink_then_files(tmp_path):
    def kind(argv_kind: str | None, sink: str) -> str:
        settings = load_settings({"SINK": sink})
        return sink_class(argparse.Namespace(kind=argv_kind), settings).cls.__name__

    assert kind(None, "") == "FileSink"
    assert kind(None, USER_SINK) == "JsonLinesSink"
    assert kind("files", USER_SINK) == "FileSink"
    found = resolve(USER_SINK, "test")
    sink = build(found, load_settings({"SINK_DIR": str(tmp_path)}), "mine")
    assert found.cls is JsonLinesSink
    assert (found.default_name, sink.name, sink.path) == ("jsonl", "mine", tmp_path / FILE_NAME)


def test_a_sink_whose_write_raises_acknowledges_nothing_and_gets_every_entry_at_restart(
        settings, redis_client, run_cli, tmp_path):
    expected = _fill(redis_client, results=4, failures=1)
    log = tmp_path / "failing.log"
    proc = _sink_process(settings, log, "--dir", str(tmp_path),
                         env={"SINK": "tests.sink.user_sinks:FailingSink"})
    try:
        assert wait_for(lambda: log.read_text().count("failed (ConnectionError") >= 2, 30), \
            log.read_text()[-3000:]
        # Delivered to the sink, written nowhere, acknowledged never: all pending, untrimmed.
        assert _pending(redis_client) == set(expected)
        assert redis_client.xlen(RESULTS_STREAM) + redis_client.xlen(FAILURES_STREAM) == 5
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "stopped with a batch unwritten; it is replayed at the next start" in log.read_text()
    assert _written(tmp_path) == []

    rerun = run_cli("-m", "common.ops.console", "sink", USER_SINK, "--dir", str(tmp_path),
                    "--idle-exit", "1")

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _assert_all_written_acknowledged_and_trimmed(redis_client, tmp_path, expected)


def test_a_sink_killed_mid_batch_and_restarted_has_every_entry_and_acknowledged_only_what_it_wrote(
        settings, redis_client, run_cli, tmp_path):
    expected = _fill(redis_client, results=12, failures=2)
    env = {"SINK_BATCH": "3"}

    killed = run_cli("-m", "common.ops.console", "sink", "tests.sink.user_sinks:DyingSink",
                     "--dir", str(tmp_path), "--idle-exit", "5", env=env)

    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    written, pending = set(_written(tmp_path)), _pending(redis_client)
    assert pending, "the batch it died in is not acknowledged"
    assert pending & written and pending - written, "half of that batch reached the file"
    # Acknowledged = delivered to the group and no longer pending: every such entry is written.
    for stream in (RESULTS_STREAM, FAILURES_STREAM):
        info = {g["name"].decode(): g for g in redis_client.xinfo_groups(stream)}[GROUP]
        last = Entry(stream, info["last-delivered-id"].decode(), {}).position
        acknowledged = {key for key in expected if key[0] == stream
                        and Entry(*key, {}).position <= last} - pending
        assert acknowledged <= written

    rerun = run_cli("-m", "common.ops.console", "sink", USER_SINK, "--dir", str(tmp_path),
                    "--idle-exit", "1", env=env)

    assert rerun.returncode == 0, rerun.stderr[-3000:]
    _assert_all_written_acknowledged_and_trimmed(redis_client, tmp_path, expected)
