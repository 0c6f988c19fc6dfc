"""Local mode's control plane: ``up`` starts ``scrape-fleet api`` as the process "api".

It listens on API_HOST (default loopback) and API_PORT (8000 when free, else a free port, as
``--any-port`` asks), is ready when ``GET /api/health`` answers 200, and is the first process
``down`` stops (no command reaches the fleet while it stops). ``up`` prints its URL and how to
make a user (the UI's login) and a token (programs'); the port is kept in state.json, so a
second ``up`` prints them again.
"""

from __future__ import annotations

import ipaddress
import urllib.error
import urllib.request
from collections.abc import Callable

from common.core.config import Settings, load_settings
from common.ops.fleet_dir import FleetDir, Proc
from common.ops.servers import pick_port

#: The process's name in state.json, and its key for the port.
NAME = "api"
PORT_KEY = "api_port"
#: How to get in: the web UI logs in as a user, programs call with a token.
USER_COMMAND = "scrape-fleet api user add me --scope admin"
TOKEN_COMMAND = "scrape-fleet api token create NAME --scope read"


def api_port(values: dict[str, str], *, any_port: bool) -> int:
    """The port the control plane gets: API_PORT of the fleet's settings when free (picked
    once RabbitMQ and Redis listen: their ports are taken by then)."""
    return pick_port(None if any_port else _settings(values).api_port)


def health_url(values: dict[str, str], port: int) -> str:
    """Where to ask whether it is up: its own address, loopback when it listens on all."""
    host = _settings(values).api_host or "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:  # a host name
        return f"http://{host}:{port}/api/health"
    if address.is_unspecified:
        host = "127.0.0.1" if address.version == 4 else "::1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/api/health"


def is_healthy(url: str) -> bool:
    """True when ``url`` answers 200 (a refused or unanswered call: not yet)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


def api_ready(values: dict[str, str], port: int) -> Callable[[], bool]:
    """Local mode's readiness check of the process: its health route answers 200."""
    url = health_url(values, port)
    return lambda: is_healthy(url)


def stop_api(proc: Proc | None, say: Callable[[str], None]) -> bool:
    """SIGTERM and wait (uvicorn ends the open streams); True when it stopped on SIGTERM."""
    if proc is None or not proc.alive:
        return True
    stopped = proc.stop(15)
    say("api: stopped" if stopped else "api: killed (it did not stop in 15 s)")
    return stopped


def api_lines(fleet: FleetDir) -> list[str]:
    """What ``up`` prints about the control plane (nothing for a fleet started without it)."""
    _procs, state = fleet.read_state()
    port = state.get(PORT_KEY)
    if not port:
        return []
    home = health_url(fleet.read_env(), int(port)).removesuffix("api/health")
    return [f"  control plane: {home}  (web UI; the API's docs at /api/docs)",
            f"    a user for the UI: {USER_COMMAND}  a token for programs: {TOKEN_COMMAND}"]


def _settings(values: dict[str, str]) -> Settings:
    return load_settings({k: v for k, v in values.items() if k.startswith("API_")})
