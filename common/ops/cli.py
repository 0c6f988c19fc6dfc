"""What every entry script shares: settings, logging, and turning known errors into exit codes.

Exit codes: 0 ok, 1 finished but some work failed, 2 bad configuration or arguments,
3 RabbitMQ or Redis unreachable, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from common.core.config import Settings, load_settings
from common.core.errors import ConfigError, ServiceUnavailable

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3


class JsonFormatter(logging.Formatter):
    """One JSON object a line (LOG_FORMAT=json), for log shippers."""

    def __init__(self, worker_id: str) -> None:
        super().__init__()
        self.worker_id = worker_id

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "worker": self.worker_id, "logger": record.name, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(settings.worker_id))
    else:
        handler.setFormatter(logging.Formatter(
            f"%(asctime)s %(levelname)s [{settings.worker_id}] %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)
    # pika logs every connection hiccup at ERROR/WARNING with tracebacks; our code logs the
    # outcome once, so keep pika's own chatter for DEBUG runs.
    if settings.log_level != "DEBUG":
        logging.getLogger("pika").setLevel(logging.CRITICAL)


def run(main: Callable[[Settings], int]) -> None:
    """Load settings once, configure logging, run ``main`` and exit with its code."""
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    setup_logging(settings)
    try:
        code = main(settings)
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        code = EXIT_CONFIG
    except ServiceUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


# -- argument types shared by the entry scripts -----------------------------------------------

def argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` as an argparse type: a ValueError becomes "argument --x: message", exit 2."""

    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return checked


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value
