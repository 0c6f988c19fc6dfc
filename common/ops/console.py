"""``scrape-fleet``: one command with a subcommand per entry script, plus ``up`` and ``down``.

    scrape-fleet up [--workers N] [--dir DIR]    # local mode (common/ops/local_mode.py)
    scrape-fleet produce -f urls.txt             # = python producer.py -f urls.txt
    scrape-fleet COMMAND --help

One command with subcommands, as ``rq worker``/``rq info``, ``scrapy crawl``, ``celery
worker``: one name to remember, one ``--help`` listing everything (NOTES #39). Each subcommand
runs the same function as its root script (``python producer.py`` = ``scrape-fleet
produce``), through :func:`common.ops.cli.run`: same settings, exit codes and messages. That
function, ``NAME_main(settings, argv=None, prog=None)``, parses ``argv`` (None: the command
line) and returns the exit code. A subcommand's module is imported only when it runs, so
``--help`` stays fast.

With no connection variable set (RABBITMQ_URL, REDIS_URL or their host/port parts), the
commands other than ``up``/``down``/``config``/``try`` use the local fleet's fleet.env, or stop at
once when that fleet is down (:func:`common.ops.local_fleet.point_at_local_fleet`); ``export``
then reads the files sink's parts alone.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from functools import partial
from importlib.metadata import PackageNotFoundError, version

from common.ops import cli
from common.ops.local_fleet import point_at_local_fleet

#: name: (module, function, one line of help). Local mode first, then the root scripts'.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "up": ("common.ops.local_mode", "up_main",
           "start RabbitMQ, Redis, workers and the files sink here, in the background"),
    "down": ("common.ops.local_mode", "down_main",
             "stop them: workers finish their work, then sink, Redis (saved), RabbitMQ"),
    "config": ("common.ops.fleet_settings", "config_main",
               "show or change the settings the next `up` runs with"),
    "produce": ("common.ops.cli_seed", "produce_main", "seed URLs (producer.py)"),
    "sitemap": ("common.ops.cli_seed", "sitemap_main",
                "seed URLs from sitemaps and feeds (sitemap_producer.py)"),
    "seed": ("common.ops.cli_seed", "seed_main", "add URLs to a running job's run (--job NAME)"),
    "work": ("common.ops.cli_run", "work_main", "run one worker in the foreground (worker.py)"),
    "status": ("common.ops.cli_inspect", "status_main",
               "queues, progress, rate and ETA, workers (stats.py)"),
    "export": ("common.ops.cli_export", "export_main",
               "results as JSON Lines or CSV (export.py)"),
    "dlq": ("common.ops.cli_inspect", "dlq_main",
            "list, replay or purge dead letters (dlq.py)"),
    "sink": ("common.ops.cli_run", "sink_main", "run or retire a result sink (sink.py)"),
    "schedule": ("common.ops.cli_schedule", "schedule_main",
                 "recrawl URLs on an adaptive schedule (scheduler.py)"),
    "reparse": ("common.ops.reparse", "reparse_main",
                "results again from archived WARC files, no fetching (reparse.py)"),
    "job": ("common.ops.cli_job", "job_main",
            "submit, follow, pause, resume, cancel a job and read its results"),
    "api": ("common.api.cli", "api_main",
            "the control plane: HTTP API and web UI; tokens and users"),
    "try": ("common.ops.cli_try", "try_main",
            "what your rules and handlers give on one page, no fleet needed"),
}
LOCAL_MODE = ("up", "down", "config")
#: Commands that need no fleet: local mode's, and the offline checker.
NO_FLEET = (*LOCAL_MODE, "try")


def overview() -> str:
    """``scrape-fleet --help``."""
    rows = [f"  {name:<9}{help_line}" for name, (_m, _f, help_line) in COMMANDS.items()]
    return "\n".join([
        f"usage: scrape-fleet [-h] [--version] {{{','.join(COMMANDS)}}} ...", "",
        "A distributed web-scraping fleet on RabbitMQ and Redis.", "",
        "local mode (this machine, no Docker; Debian's rabbitmq-server and redis-server):",
        *rows[:3], "", "commands (each also a root script, e.g. python producer.py):",
        *rows[3:-1], "", "offline:", *rows[-1:], "",
        "`scrape-fleet COMMAND --help` shows a command's options. Settings are environment",
        "variables (docs/reference/configuration.md). When none of RABBITMQ_URL, REDIS_URL",
        "or their host/port parts is set, commands use the fleet `up` started: DIR/fleet.env,",
        "with DIR $SCRAPE_FLEET_DIR or ~/.local/share/scrape-fleet.",
    ])


def main(argv: list[str] | None = None) -> None:
    """The ``scrape-fleet`` console script: dispatch to a command; exits with its code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(overview(), file=sys.stdout if args else sys.stderr)
        sys.exit(cli.EXIT_OK if args else cli.EXIT_CONFIG)
    if args[0] == "--version":
        print(f"scrape-fleet {_version()}")
        sys.exit(cli.EXIT_OK)
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        print(f"scrape-fleet: unknown command {name!r}{hint} (scrape-fleet --help lists them)",
              file=sys.stderr)
        sys.exit(cli.EXIT_CONFIG)
    if name not in NO_FLEET:
        rest = point_at_local_fleet(name, rest, os.environ)
    module, function, _help = COMMANDS[name]
    command = getattr(importlib.import_module(module), function)
    cli.run(partial(command, argv=rest, prog=f"scrape-fleet {name}"))


def _version() -> str:
    try:
        return version("scrape-fleet")
    except PackageNotFoundError:
        return "(not installed: running from a checkout)"


if __name__ == "__main__":
    main()
