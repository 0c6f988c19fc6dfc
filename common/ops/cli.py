"""What every entry script shares: settings, logging, and turning known errors into exit codes.

Exit codes: 0 ok, 1 finished but some work failed, 2 bad configuration or arguments,
3 RabbitMQ or Redis unreachable, 130 interrupted. A reader that goes away (``status | head``)
ends a command quietly with 0, as it does ``cat``: no BrokenPipeError traceback.

Log lines cannot be forged: values from outside (URLs, titles, header values, error strings)
reach the log inside messages, so the text format escapes every control character of the
message (``\n`` as ``\\n``, other C0/C1 controls and U+2028/9 as ``\\x..``/``\\u....``) and
one record stays one line; only a traceback keeps its line breaks, with its exception messages
escaped the same way. The JSON format escapes them by being JSON. Both formats, and the errors
:func:`run` prints, mask the passwords of the settings (:meth:`Settings.secrets`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Collection, Iterator
from typing import Any

from common.core.config import Settings, load_settings
from common.core.errors import ConfigError, ServiceUnavailable
from common.core.redact import scrub

EXIT_OK = 0
EXIT_PARTIAL = 1
EXIT_CONFIG = 2
EXIT_UNAVAILABLE = 3


_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_one(match: re.Match[str]) -> str:
    char = match.group()
    return _NAMED.get(char) or (f"\\x{ord(char):02x}" if ord(char) < 0x100
                                else f"\\u{ord(char):04x}")


def escape_controls(text: str) -> str:
    """``text`` on one line: control characters (C0, DEL, C1, U+2028/2029) as escapes."""
    return _CONTROLS.sub(_escape_one, text)


def _exception_messages(exc: BaseException | None) -> Iterator[str]:
    """str() of ``exc`` and of every exception chained to or grouped in it."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        try:
            yield str(current)
        except Exception:  # noqa: BLE001, S110 - a broken __str__ shows as the traceback does
            pass
        todo += [current.__cause__, current.__context__,
                 *getattr(current, "exceptions", ())]


class TextFormatter(logging.Formatter):
    """LOG_FORMAT=text: one line a record, control characters escaped, secrets masked."""

    def __init__(self, worker_id: str, secrets: Collection[str] = ()) -> None:
        worker = worker_id.replace("%", "%%")
        super().__init__(f"%(asctime)s %(levelname)s [{worker}] %(name)s: %(message)s")
        self.secrets = secrets

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape_controls(scrub(super().formatMessage(record), self.secrets))

    def formatException(self, ei: Any) -> str:
        # The frames are our code and keep their lines; the exception messages may carry
        # outside text, so they are escaped wherever the traceback shows them.
        text = super().formatException(ei)
        for message in sorted(set(_exception_messages(ei[1])), key=len, reverse=True):
            escaped = escape_controls(message)
            if escaped != message:
                text = text.replace(message, escaped)
        lines = scrub(text, self.secrets).split("\n")
        return "\n".join(escape_controls(line) for line in lines)


class JsonFormatter(logging.Formatter):
    """One JSON object a line (LOG_FORMAT=json), for log shippers."""

    def __init__(self, worker_id: str, secrets: Collection[str] = ()) -> None:
        super().__init__()
        self.worker_id = worker_id
        self.secrets = secrets

    def format(self, record: logging.LogRecord) -> str:
        entry = {"time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"), "level": record.levelname,
                 "worker": self.worker_id, "logger": record.name,
                 "message": scrub(record.getMessage(), self.secrets)}
        if record.exc_info:
            entry["exception"] = scrub(self.formatException(record.exc_info), self.secrets)
        # json escapes C0 controls; U+2028/2029 and NEL too, for readers that split on them.
        line = json.dumps(entry, ensure_ascii=False)
        return line.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029") \
            .replace("\x85", "\\u0085")


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(settings.worker_id, settings.secrets()))
    else:
        handler.setFormatter(TextFormatter(settings.worker_id, settings.secrets()))
    logging.basicConfig(level=settings.log_level, handlers=[handler], force=True)
    # pika logs every connection hiccup at ERROR/WARNING with tracebacks; our code logs the
    # outcome once, so keep pika's own chatter for DEBUG runs.
    if settings.log_level != "DEBUG":
        logging.getLogger("pika").setLevel(logging.CRITICAL)


def run(main: Callable[[Settings], int]) -> None:
    """Load settings once, configure logging, run ``main`` and exit with its code."""
    try:
        settings = load_settings()
    except ConfigError as exc:  # its message already hides secrets (Knob.invalid)
        print(f"configuration error: {escape_controls(str(exc))}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    setup_logging(settings)

    def shown(exc: Exception) -> str:
        return escape_controls(scrub(str(exc), settings.secrets()))

    try:
        code = _quiet_on_closed_stdout(main, settings)
    except ConfigError as exc:
        print(f"configuration error: {shown(exc)}", file=sys.stderr)
        code = EXIT_CONFIG
    except ServiceUnavailable as exc:
        print(f"error: {shown(exc)}", file=sys.stderr)
        code = EXIT_UNAVAILABLE
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


def _quiet_on_closed_stdout(main: Callable[[Settings], int], settings: Settings) -> int:
    """``main(settings)``, its output flushed; a reader that went away (``status | head``)
    ends it quietly, exit 0, as ``cat`` would, instead of a BrokenPipeError traceback.

    The Python docs' recipe (library/signal, "Note on SIGPIPE"): stdout goes to devnull, so
    the flush at exit cannot fail again.
    """
    try:
        code = main(settings)
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
        return EXIT_OK
    except SystemExit:  # argparse's --help and errors: their text is flushed here too
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_to_devnull()
        raise
    return code


def _stdout_to_devnull() -> None:
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


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
