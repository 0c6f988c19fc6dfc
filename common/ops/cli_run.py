"""The long-running commands: ``work`` (worker.py) and ``sink`` (sink.py).

Each ``*_main`` is a command of common/ops/console.py and the body of its root script.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from common.core.config import Settings
from common.core.errors import ConfigError
from common.core.redact import scrub
from common.ops import cli, native
from common.web.renderer import Renderer
from common.work.loop_redis import worker_client
from common.work.processor import Processor
from common.work.worker import Worker

if TYPE_CHECKING:
    from common.media.processor import MediaProcessor
    from common.sink.plugins import SinkClass

logger = logging.getLogger(__name__)


def work_args(settings: Settings, argv: list[str] | None = None,
              prog: str | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog=prog, description="Run one scraper worker.")
    parser.add_argument("--concurrency", type=int, default=None,
                        help=f"parallel fetches (default {settings.concurrency}; a render "
                             "worker: twice RENDER_THREADS)")
    parser.add_argument("--render", action="store_true", default=settings.render_worker,
                        help="render pages in Chromium: consume the render queues "
                             "(RENDER_WORKER; docs/rendering.md)")
    parser.add_argument("--media", action="store_true", default=settings.media_worker,
                        help="download assets into MEDIA_STORE: consume the media queues "
                             "(MEDIA_WORKER; docs/media.md)")
    parser.add_argument("--idle-exit", type=float, default=settings.idle_exit_s, metavar="SECONDS",
                        help="exit 0 after this long without a message (0 = never), once no "
                             "retry or wait shorter than that is in a hold queue")
    args = parser.parse_args(argv)
    if args.concurrency is not None and args.concurrency < 1:
        parser.error("--concurrency must be >= 1")
    if args.idle_exit < 0:
        parser.error("--idle-exit must be >= 0")
    if args.render and args.media:
        parser.error("--render and --media are two kinds of worker: start one of each")
    if args.media:  # its assets are never read from or stored in the response cache
        return settings.with_overrides(concurrency=args.concurrency or settings.concurrency,
                                       idle_exit_s=args.idle_exit, media_worker=True,
                                       cache_ttl_s=0)
    if not args.render:
        return settings.with_overrides(concurrency=args.concurrency or settings.concurrency,
                                       idle_exit_s=args.idle_exit)
    # A render worker: a task per page a browser may render, and one waiting behind each (a
    # task waits for its browser within the render's deadline). Its pages are never read
    # from or stored in the response cache: the cache holds plain responses.
    return settings.with_overrides(
        concurrency=args.concurrency or 2 * settings.render_threads, idle_exit_s=args.idle_exit,
        render_worker=True, cache_ttl_s=0)


def work_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``worker.py`` / ``scrape-fleet work``."""
    settings = work_args(settings, argv, prog)
    renderer = _renderer(settings) if settings.render_worker else None  # ConfigError: exit 2
    redis_client = worker_client(settings)  # replies read through the fetch loop
    processor: Processor | MediaProcessor
    if settings.media_worker:  # MEDIA_STORE: ConfigError at start (exit 2)
        # Imported here: the media store's client (minio) is only a download worker's.
        from common.media.processor import MediaProcessor

        processor = MediaProcessor(settings, redis_client)
    else:
        processor = Processor(settings, redis_client, renderer=renderer)
        unbuilt = native.unbuilt()
        if unbuilt:
            logger.warning("%s not built: a page costs ~10%% more CPU (build with: python -m "
                           "common.ops.native)", " and ".join(unbuilt))
    worker = Worker(settings, processor)
    worker.install_signal_handlers()
    return worker.run()


def _renderer(settings: Settings) -> Renderer:
    """A render worker's browsers, once what they need is here (else ConfigError at start,
    not a dead letter per page)."""
    if importlib.util.find_spec("playwright") is None:
        raise ConfigError("a render worker needs Playwright for Python: pip install "
                          "'scrape-fleet[render]' (or requirements-render.lock); no browser is "
                          "downloaded, it drives BROWSER_EXECUTABLE")
    executable = settings.browser_executable
    if not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
        raise ConfigError(f"BROWSER_EXECUTABLE={executable}: not an executable file; install "
                          "the distribution's Chromium (Debian: apt install chromium) or point "
                          "BROWSER_EXECUTABLE at it")
    return Renderer(settings, settings.render_threads)


def sink_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    """``[KIND] [--dir DIR] [--name NAME] [--idle-exit S]`` (``command`` "run"), or
    ``retire NAME`` (``command`` "retire")."""
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = prog or os.path.basename(sys.argv[0])
    if argv[:1] == ["retire"]:
        gone = argparse.ArgumentParser(prog=f"{prog} retire",
                                       description="Unregister a sink (stop its process first).")
        gone.add_argument("name", help="the sink's registered name")
        return argparse.Namespace(**vars(gone.parse_args(argv[1:])), command="retire")
    parser = argparse.ArgumentParser(
        prog=prog, description="Run a result sink, or retire one.",
        usage=f"{prog} [KIND] [--dir DIR] [--name NAME] [--idle-exit SECONDS]\n"
              f"       {prog} retire NAME")
    parser.add_argument("kind", nargs="?", metavar="KIND",
                        help="files (rotating gzip JSON Lines), postgres (upsert into "
                             "POSTGRES_URL), a name registered under the scrape_fleet.sinks "
                             "entry point, or package.module:Class (default: SINK, else files)")
    parser.add_argument("--dir", metavar="DIR", help="SINK_DIR for this run (the files sink's "
                                                     "directory)")
    parser.add_argument("--name", help="registered name (default: the kind's name)")
    parser.add_argument("--idle-exit", type=cli.argument(_non_negative), default=0.0,
                        metavar="SECONDS", help="exit 0 after SECONDS with nothing new")
    return argparse.Namespace(**vars(parser.parse_args(argv)), command="run")


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise ValueError(f"expected seconds >= 0, got {text!r}")
    return value


def sink_class(args: argparse.Namespace, settings: Settings) -> SinkClass:
    """The sink class the command line's KIND, else SINK, else ``files`` names (ConfigError
    naming which of them was wrong)."""
    # Imported here, as in sink_main: a worker process never loads the sinks.
    from common.sink.plugins import DEFAULT_KIND, resolve

    if args.kind:
        return resolve(args.kind, f"sink kind {args.kind!r}")
    if settings.sink:
        return resolve(settings.sink, f"SINK={settings.sink!r}")
    return resolve(DEFAULT_KIND, "the default sink")


def _start_error(kind: str, exc: Exception, settings: Settings) -> int:
    """Print why the sink could not be built; the exit code."""
    text = cli.escape_controls(scrub(f"{exc}", settings.secrets()))
    if isinstance(exc, ConfigError | ValueError | TypeError):
        print(f"configuration error: the {kind} sink: {text}", file=sys.stderr)
        return cli.EXIT_CONFIG
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError | TimeoutError):
        print(f"error: the {kind} sink cannot use its file or directory: {text}",
              file=sys.stderr)
        return cli.EXIT_CONFIG
    print(f"error: the {kind} sink cannot start: {type(exc).__name__}: {text}", file=sys.stderr)
    return cli.EXIT_UNAVAILABLE


def sink_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``sink.py`` / ``scrape-fleet sink``."""
    from common.sink.plugins import build
    from common.sink.reader import SinkReader, retire, run_sink
    from common.store.connection import connect_redis

    args = sink_args(argv, prog)
    if args.command == "retire":
        if not retire(connect_redis(settings), args.name):
            print(f"no sink named {args.name!r}", file=sys.stderr)
            return cli.EXIT_PARTIAL
        print(f"retired sink {args.name!r}: unregistered, consumer groups destroyed")
        return cli.EXIT_OK
    found = sink_class(args, settings)  # a wrong kind is told before any connection
    client = connect_redis(settings)
    if args.dir:
        settings = settings.with_overrides(sink_dir=args.dir)
    try:
        sink = build(found, settings, args.name)
    except Exception as exc:  # noqa: BLE001 - the sink's own start-up error, told and exit 2/3
        return _start_error(found.kind, exc, settings)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    reader = SinkReader(client, sink.name, consumer=sink.name, batch=settings.sink_batch)
    return run_sink(reader, sink, stop, idle_exit_s=args.idle_exit)
