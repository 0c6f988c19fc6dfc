"""What local mode prints when the fleet is up: where everything is, the next commands."""

from __future__ import annotations

import shlex
from urllib.parse import unquote, urlsplit

from common.ops import local_api
from common.ops.fleet_dir import DIR_VARIABLE, FleetDir, default_dir
from common.ops.fleet_settings import SETTABLE, described


def dir_flag(fleet: FleetDir) -> str:
    return "" if fleet.path == default_dir() else f" --dir {fleet.path}"


def started_text(fleet: FleetDir, workers: int, *, already: bool = False,
                 renderers: int = 0, downloaders: int = 0) -> str:
    """What ``up`` prints: where everything is, and the next commands to type."""
    env = fleet.read_env()
    ui, amqp, store = (urlsplit(env[k]) for k in ("RABBITMQ_MANAGEMENT_URL", "RABBITMQ_URL",
                                                  "REDIS_URL"))
    steps = [(f"export {DIR_VARIABLE}={shlex.quote(str(fleet.path))}",
              "so the commands below find this fleet")] if fleet.path != default_dir() else []
    steps += [("scrape-fleet produce -f urls.txt", "seed your URLs: one a line, '#' comments"),
              ("scrape-fleet status --watch", "progress, rate and ETA (Ctrl-C leaves)"),
              ("scrape-fleet export -o results.jsonl", "every result so far, as JSON Lines"),
              (f"scrape-fleet down{dir_flag(fleet)}", "stop: workers finish what they hold")]
    width = max(len(command) for command, _ in steps) + 2
    return "\n".join([
        f"scrape-fleet is {'already ' if already else ''}up: {workers} workers, "
        + (f"{renderers} render workers (Chromium), " if renderers else "")
        + (f"{downloaders} download workers (assets in {fleet.path / 'media'}), "
           if downloaders else "")
        + f"the files sink, the scheduler (jobs) and the control plane, data in {fleet.path}",
        # The password is never printed: it is in fleet.env (mode 0600), RABBITMQ_MANAGEMENT_URL.
        f"  RabbitMQ management UI: http://localhost:{ui.port}  user "
        f"{unquote(ui.username or '')}  password: RABBITMQ_MANAGEMENT_URL in {fleet.env_file}",
        f"  AMQP 127.0.0.1:{amqp.port}, Redis 127.0.0.1:{store.port} (URLs in {fleet.env_file})",
        *local_api.api_lines(fleet),
        f"  logs: {fleet.logs}/  results (gzip JSON Lines): {fleet.results}/",
        f"settings (kept for the next up in {fleet.settings_file}; `scrape-fleet config set "
        "KEY=VALUE` changes them):",
        *described({k: v for k, v in env.items() if k in SETTABLE}, fleet),
        "next:", *(f"  {command:<{width}}# {why}" for command, why in steps),
    ])
