"""Local mode: ``scrape-fleet up`` starts RabbitMQ, Redis, N workers, the files sink, the
scheduler (its job runner runs the jobs) and the control plane (:mod:`common.ops.local_api`) on
this machine, on loopback, in the background; ``scrape-fleet down`` stops them, losing no work.

``up`` starts, in this order, each in its own process group and recorded in state.json as soon
as it runs (so ``down`` can stop a half-started fleet): RabbitMQ from Debian's scripts
(:class:`~common.ops.rabbit_node.RabbitNode`; AMQP on 5672, the management UI on 15672 when
free, else free ports), Redis with an AOF and a password, the files sink (registered before any
result, so the streams keep every entry until it is in the files), the workers, ``schedule
run``, ``api``, waiting for each (the sink's registration, the workers' heartbeats, the job
runner's lease, the API's health), writes fleet.env, prints how to seed, watch, export, stop
and reach the control plane, and the settings it runs with (:mod:`common.ops.fleet_settings`:
settings.env's from the last run, updated by the environment, ``--set`` and
``--allow-network``, kept for the next). All in one directory (:mod:`common.ops.fleet_dir`),
kept between runs: queued URLs, results and the seen-set are there again at the next ``up``.

``down`` stops in the order that loses nothing: the API, then the workers get SIGTERM and
finish what they hold (ack after the outcome is durable; one still busy after ``--timeout`` is
killed and the broker redelivers what it held at the next ``up``), the sink and the scheduler's
learner read what is left, the scheduler stops (a half-seeded run is seeded on at the next
``up``), Redis saves and shuts down, RabbitMQ stops (``rabbitmqctl stop``; Erlang's ``epmd``,
shared by every node on the machine, may stay, as after any RabbitMQ).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import redis

from common.core.config import Settings
from common.core.values import non_negative_int
from common.ops import cli, local_api
from common.ops.fleet_dir import LOCAL_VARIABLES, FleetDir, Proc, default_dir
from common.ops.fleet_settings import (
    assignment,
    from_environment,
    run_settings,
    running_text,
)
from common.ops.local_text import dir_flag, started_text
from common.ops.rabbit_node import RabbitNode
from common.ops.servers import (
    ServicesUnavailable,
    find_binaries,
    pick_port,
    redis_command,
    start_redis,
    tail,
)
from common.store.backlog import read_fill
from common.store.keys import JOBS_LEASE, SINKS, worker_key

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: The ports a newcomer expects (docker compose publishes the same), used when free.
DEFAULT_PORTS = {"amqp": 5672, "management": 15672, "redis": 6379}
SINK_NAME = "files"
READY_TIMEOUT_S = 60.0


def _args(argv: list[str] | None, prog: str | None, down: bool) -> argparse.Namespace:
    what = ("Stop the local fleet: workers drain, then the sink, Redis (saved) and RabbitMQ."
            if down else "Start RabbitMQ, Redis, workers and the files sink on this machine, "
                         "in the background, with their data in one directory.")
    parser = argparse.ArgumentParser(prog=prog, description=what)
    parser.add_argument("--dir", type=Path, metavar="DIR",
                        help=f"the fleet's directory (default $SCRAPE_FLEET_DIR, else "
                             f"{default_dir({})})")
    if down:
        parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                            help="how long workers may take to finish (default 120)")
    else:
        parser.add_argument("--workers", type=cli.positive_int, default=2, metavar="N",
                            help="worker processes (default 2)")
        parser.add_argument("--render", type=cli.argument(non_negative_int), default=0, metavar="N",
                            help="render workers driving Chromium, for pages that need a "
                                 "browser (docs/rendering.md; default 0)")
        parser.add_argument("--media", type=cli.argument(non_negative_int), default=0, metavar="N",
                            help="download workers storing the assets rules and handlers ask "
                                 "for in DIR/media (docs/media.md; default 0)")
        parser.add_argument("--any-port", action="store_true",
                            help="free loopback ports instead of 5672, 15672 and 6379")
        parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                            help="a setting (docs/reference/configuration.md), kept for the next "
                                 "runs in DIR/settings.env (repeatable; `scrape-fleet config` "
                                 "shows and changes them)")
        parser.add_argument("--allow-network", action="append", default=[], metavar="CIDR",
                            help="let fetches reach this private network, e.g. 127.0.0.0/8 "
                                 "for a site on this machine (added to FETCH_ALLOW_NETWORKS, "
                                 "kept; repeatable)")
    args = parser.parse_args(argv)
    args.fleet = FleetDir((args.dir or default_dir()).expanduser().resolve())
    return args


def up_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``scrape-fleet up``."""
    args = _args(argv, prog, down=False)
    fleet: FleetDir = args.fleet
    stored = fleet.read_settings()
    values = run_settings(stored, os.environ, [assignment(text) for text in args.set],
                          args.allow_network)
    # A variable set for this `up` is kept too: say so, and how to forget it.
    taken = [k for k, v in from_environment(os.environ).items()
             if stored.get(k) != v and values.get(k) == v]
    procs, state = fleet.read_state()
    running = [p for p in procs if p.alive]
    if running:
        if len(running) == len(procs):
            print(started_text(fleet, int(str(state.get("workers", 0))), already=True,
                               renderers=int(str(state.get("renderers", 0))),
                               downloaders=int(str(state.get("downloaders", 0)))))
            if values != stored:
                fleet.write_settings(values)
                print(f"settings saved in {fleet.settings_file}; {running_text(fleet)}")
            return cli.EXIT_OK
        dead = ", ".join(p.name for p in procs if not p.alive)
        print(f"the fleet in {fleet.path} is partly up ({dead} not running): "
              f"`scrape-fleet down{dir_flag(fleet)}` first", file=sys.stderr)
        return cli.EXIT_PARTIAL
    binaries = find_binaries()
    fleet.create()
    fleet.write_settings(values)
    node = _node(fleet, binaries, any_port=args.any_port)
    started: list[Proc] = []
    state = {"node": node.nodename, "workers": args.workers, "renderers": args.render,
             "downloaders": args.media}
    try:
        print(f"starting RabbitMQ {node.nodename} (takes 5-20 s)...", file=sys.stderr)
        started.append(Proc.of("rabbitmq", node.launch(fleet.logs / "rabbitmq.out").pid))
        fleet.write_state(started, **state)
        password = secrets.token_urlsafe(18)
        redis_port = pick_port(None if args.any_port else DEFAULT_PORTS["redis"],
                               taken=(node.port, node.management_port, node.dist_port))
        redis_url = f"redis://:{password}@127.0.0.1:{redis_port}/0"
        client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
        cmd = redis_command(binaries["redis-server"], port=redis_port, directory=fleet.redis,
                            appendonly=True, password=password)
        started.append(Proc.of("redis", start_redis(cmd, client, timeout_s=30).pid))
        fleet.write_state(started, **state)
        user, secret = (quote(part, safe="") for part in node.management_auth)
        env = {**values, "RABBITMQ_URL": node.url, "REDIS_URL": redis_url,
               "RABBITMQ_MANAGEMENT_URL": f"http://{user}:{secret}@127.0.0.1:"
                                          f"{node.management_port}",
               "SINK_DIR": str(fleet.results), "MEDIA_STORE": values.get(
                   "MEDIA_STORE", str(fleet.path / "media"))}  # local mode's file store
        fleet.write_env(env)
        started.append(_spawn(fleet, "sink", ["sink", "files", "--name", SINK_NAME], env))
        fleet.write_state(started, **state)
        _wait_ready(started[-1], fleet, lambda: client.sismember(SINKS, SINK_NAME))
        workers = {f"local-{n}": _spawn(fleet, f"worker-{n}", ["work"], env,
                                        {"WORKER_ID": f"local-{n}"})
                   for n in range(1, args.workers + 1)}
        workers.update({f"local-render-{n}": _spawn(fleet, f"worker-render-{n}",
                                                    ["work", "--render"], env,
                                                    {"WORKER_ID": f"local-render-{n}"})
                        for n in range(1, args.render + 1)})
        workers.update({f"local-media-{n}": _spawn(fleet, f"worker-media-{n}",
                                                   ["work", "--media"], env,
                                                   {"WORKER_ID": f"local-media-{n}"})
                        for n in range(1, args.media + 1)})
        started += workers.values()
        fleet.write_state(started, **state)
        for worker_id, proc in workers.items():
            _wait_ready(proc, fleet, lambda w=worker_id: client.exists(worker_key(w)))
        # The job runner (and recrawl scheduler): ready once it holds its lease.
        started.append(_spawn(fleet, "scheduler", ["schedule", "run"], env,
                              {"WORKER_ID": "local-scheduler"}))
        fleet.write_state(started, **state)
        _wait_ready(started[-1], fleet, lambda: client.exists(JOBS_LEASE))
        port = state[local_api.PORT_KEY] = local_api.api_port(values, any_port=args.any_port)
        started.append(_spawn(fleet, local_api.NAME, ["api"], env, {"API_PORT": str(port)}))
        fleet.write_state(started, **state)
        _wait_ready(started[-1], fleet, local_api.api_ready(values, port))
    except BaseException:
        print("start failed: stopping what started", file=sys.stderr)
        stop_fleet(fleet, timeout_s=30, say=lambda text: print(text, file=sys.stderr))
        raise
    print(started_text(fleet, args.workers, renderers=args.render, downloaders=args.media))
    if taken:
        print(f"kept from the environment for the next runs: {', '.join(taken)} "
              f"(`scrape-fleet config unset NAME` forgets one)")
    return cli.EXIT_OK


def _node(fleet: FleetDir, binaries: dict[str, str], *, any_port: bool) -> RabbitNode:
    """The fleet's node: the same name and user every run (kept in node.json: the stored
    user must match), ports picked now."""
    saved = fleet.rabbitmq / "node.json"
    if saved.exists():
        known = json.loads(saved.read_text(encoding="utf-8"))
    elif (fleet.rabbitmq / "mnesia").exists():
        raise ServicesUnavailable(f"{fleet.rabbitmq} holds a node but not its node.json: "
                                  "remove that directory to start afresh")
    else:
        known = {"nodename": f"fleet-{secrets.token_hex(4)}@localhost", "username": "fleet",
                 "password": secrets.token_urlsafe(18)}
        fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(known, handle)
    amqp = pick_port(None if any_port else DEFAULT_PORTS["amqp"])
    management = pick_port(None if any_port else DEFAULT_PORTS["management"], taken=(amqp,))
    dist = pick_port(None, taken=(amqp, management))
    return RabbitNode(fleet.rabbitmq, known["nodename"], known["username"], known["password"],
                      port=amqp, management_port=management, dist_port=dist, binaries=binaries)


def _spawn(fleet: FleetDir, name: str, command: list[str], env: dict[str, str],
           extra: dict[str, str] | None = None) -> Proc:
    """``python -m common.ops.console COMMAND`` in the background, its output in logs/; the
    directory ``up`` runs in is on its import path (HANDLERS=myproject.handlers:router)."""
    package_root = str(Path(__file__).resolve().parents[2])  # where `common` is importable
    inherited = {k: v for k, v in os.environ.items() if k not in LOCAL_VARIABLES}
    path = [package_root, os.getcwd(), os.environ.get("PYTHONPATH")]
    full = dict(inherited, **env, **(extra or {}), PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(filter(None, path)))
    with (fleet.logs / f"{name}.log").open("ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "common.ops.console", *command],
                                env=full, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                cwd=fleet.path)
    return Proc.of(name, proc.pid)


def _wait_ready(proc: Proc, fleet: FleetDir, ready: Callable[[], object]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready():
        log = fleet.logs / f"{proc.name}.log"
        if not proc.alive:
            raise ServicesUnavailable(f"{proc.name} exited during start-up:\n{tail(log)}")
        if time.monotonic() > deadline:
            raise ServicesUnavailable(f"{proc.name} not ready after {READY_TIMEOUT_S:.0f} s:\n"
                                      f"{tail(log)}")
        time.sleep(0.2)


def down_main(settings: Settings, argv: list[str] | None = None,
              prog: str | None = None) -> int:
    """``scrape-fleet down``."""
    args = _args(argv, prog, down=True)
    procs, _state = args.fleet.read_state()
    if not procs:
        print(f"nothing is up in {args.fleet.path}")
        return cli.EXIT_OK
    clean = stop_fleet(args.fleet, timeout_s=args.timeout)
    print(f"down: data kept in {args.fleet.path}; `scrape-fleet up{dir_flag(args.fleet)}` "
          "starts it again")
    return cli.EXIT_OK if clean else cli.EXIT_PARTIAL


def stop_fleet(fleet: FleetDir, *, timeout_s: float, say: Callable[[str], None] = print) -> bool:
    """Stop what state.json lists, workers first; True when everything stopped cleanly."""
    procs, state = fleet.read_state()
    by_name = {p.name: p for p in procs}
    redis_url = fleet.read_env().get("REDIS_URL")
    clean = local_api.stop_api(by_name.get(local_api.NAME), say)  # first: no call while it stops
    workers = [p for p in procs if p.name.startswith("worker-")]
    for proc in workers:
        proc.signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    drained = [proc.wait(max(0.0, deadline - time.monotonic())) or proc.stop(0, group=True)
               for proc in workers]
    if workers:
        say(f"workers: {drained.count(True)} of {len(workers)} finished their work and stopped"
            + ("" if all(drained) else "; the rest were killed (the broker redelivers what "
                                        "they held at the next up)"))
        clean = all(drained)
    if (sink := by_name.get("sink")) and sink.alive:
        left = _on_redis(redis_url, "sink backlog", lambda c: _sink_backlog_after(c, 30))
        clean = sink.stop(30) and clean
        say(f"sink: every result is in {fleet.results}; stopped" if left == 0 else
            f"sink: stopped; {left} entries left for it in Redis (written at the next up)"
            if left else "sink: stopped (its backlog could not be read)")
    if (scheduler := by_name.get("scheduler")) and scheduler.alive:  # its learner read too
        clean = scheduler.stop(30) and clean
        say("scheduler: stopped (jobs go on at the next up)")
    if (server := by_name.get("redis")) and server.alive:
        saved = bool(_on_redis(redis_url, "SHUTDOWN SAVE", _save_and_shut_down)) \
            and server.wait(30)
        clean = (saved or server.stop(10, group=True)) and clean
        say("redis: saved and stopped" if saved else "redis: stopped without a save")
    if (rabbit := by_name.get("rabbitmq")) and rabbit.alive:
        node = RabbitNode(fleet.rabbitmq, str(state.get("node", "")), "", "")
        try:
            node.ctl("stop", timeout_s=60)
        except ServicesUnavailable as exc:
            say(f"rabbitmq: clean stop failed ({exc}); stopping its process group")
        stopped = rabbit.wait(30) or rabbit.stop(10, group=True)
        node.kill_leftover_beam()
        clean = stopped and clean
        say("rabbitmq: stopped")
    fleet.clear()
    return clean


def _sink_backlog_after(client: redis.Redis, timeout_s: float) -> int:
    """Wait until the sink has written everything recorded; the entries left after
    ``timeout_s`` (they stay in Redis for the next run)."""
    deadline = time.monotonic() + timeout_s
    while (left := read_fill(client).backlog) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _save_and_shut_down(client: redis.Redis) -> bool:
    client.shutdown(save=True)  # SHUTDOWN SAVE: an RDB snapshot besides the AOF, then it exits
    return True


def _on_redis(redis_url: str | None, what: str, action: Callable[[redis.Redis], T]) -> T | None:
    """``action`` with a client of the fleet's Redis; None (logged) when Redis refuses."""
    if not redis_url:
        return None
    client = redis.Redis.from_url(redis_url, socket_timeout=30)
    try:
        return action(client)
    except redis.RedisError as exc:
        logger.warning("%s: Redis refused: %s", what, exc)
        return None
    finally:
        client.close()
