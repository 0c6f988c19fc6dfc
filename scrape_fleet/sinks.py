"""Result sinks: where the fleet's results and failure records go to stay.

A sink is a class with one method to write: :meth:`Sink.write` gets a batch of
:class:`Entry` objects read from the Redis streams ``results``, ``failures`` and ``assets``
and returns once they are durable. The runner (``scrape-fleet sink``) acknowledges a batch only after
``write`` returned, and trims the streams below what every registered sink acknowledged, so
what a sink wrote is the only copy left.

What the runner promises, and what it asks in return:

- **At least once.** A batch whose ``write`` raised, or that was written but not
  acknowledged when the process died, is delivered again (a failed ``write`` is retried with
  a growing delay; a crash replays it at the next start). Make ``write`` idempotent: every
  entry carries its stream id (:attr:`Entry.id`), which grows within a stream, and one sink
  process reads in order, so "skip ids at or below the highest one written for that stream"
  or "upsert by URL, newer id wins" turns at-least-once into exactly once.
- **One batch at a time.** ``write`` is called from one thread; at most one batch is
  unacknowledged. Entries of one stream come in id order; a batch may mix the streams.
- **Durable on return.** Return from ``write`` only once the batch would survive a crash
  (fsync, COMMIT). Raise if any of it might not be: nothing is acknowledged then.

Register a sink under the entry point group ``scrape_fleet.sinks`` in your project's
``pyproject.toml`` and run it by name (``scrape-fleet sink jsonl``), or name its class
directly: ``SINK=package.module:Class`` (docs/sinks.md).

This module imports only ``common.core``: the engine imports the public package, never the
reverse.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from common.core.config import Settings

__all__ = ["ENTRY_POINT_GROUP", "Entry", "Sink"]

#: The entry point group sinks are registered under (``scrape-fleet sink NAME``).
ENTRY_POINT_GROUP = "scrape_fleet.sinks"


@dataclass(frozen=True)
class Entry:
    """One stream entry, as a sink gets it.

    Attributes:
        stream: ``"results"`` (a page's result), ``"failures"`` (a URL that failed for
            good; its record has ``"outcome": "dead_letter"``) or ``"assets"`` (a media file
            downloaded: ``page``, ``kind``, ``sha256``, ``key``, ``store``, ``size``, ...;
            skip these entries if your sink wants pages only).
        id: the stream entry id, ``"<ms>-<seq>"`` (e.g. ``"1732230000123-0"``): unique
            within its stream and growing, so it tells a replayed entry from a new one.
        record: the decoded JSON record (``url``, ``status``, ``title``, your handler's
            items, ...). A record of a job carries ``job`` (its name) and ``run`` (an
            integer >= 1); the default job's records have neither. The built-in sinks keep
            them apart (files: ``SINK_DIR/jobs/{job}/run-{run}/``; PostgreSQL: the key
            ``(job, run, url)``). Check the name before using it in a path: a record is data.
    """

    stream: str
    id: str
    record: dict[str, Any]

    @property
    def position(self) -> tuple[int, int]:
        """The id as ``(ms, seq)``: compares as Redis orders the stream."""
        ms, _, seq = self.id.partition("-")
        return int(ms), int(seq or 0)


class Sink(abc.ABC):
    """What ``scrape-fleet sink`` drives: subclass it and implement :meth:`write`.

    The runner builds the sink with :meth:`from_settings`, then calls :meth:`write` for each
    batch, :meth:`idle` when a read found nothing new, and :meth:`close` once at a clean
    stop. It sets :attr:`name` to the registered name before the first ``write``.

    A class that does not subclass ``Sink`` is accepted too if it has ``write`` and
    ``close`` methods; it is then built with ``cls()``.

    Attributes:
        name: the registered name: the sink reads through the Redis consumer group
            ``sink:{name}``, and ``scrape-fleet sink retire NAME`` unregisters it. Set it as
            a class attribute to choose the default name of ``SINK=package.module:Class``
            (otherwise the class's own name).
    """

    name: str = ""

    @classmethod
    def from_settings(cls, settings: Settings, name: str) -> Self:
        """Build the sink for ``scrape-fleet sink``; override it to read settings.

        Args:
            settings: the fleet's settings, read from the environment once (for instance
                ``settings.sink_dir``, ``SINK_DIR``). Options of your own: read them here.
            name: the registered name (the runner also sets :attr:`name` to it).

        Returns:
            The sink, ready to write. Raise ``ValueError`` for a bad or missing setting:
            ``scrape-fleet sink`` exits 2 with the message. Any other error means the sink
            cannot start (its store unreachable): exit 3, or 2 for a file or directory it
            cannot use (an ``OSError`` other than a connection error).
        """
        return cls()

    @abc.abstractmethod
    def write(self, entries: list[Entry]) -> None:
        """Write ``entries`` durably; return only when they would survive a crash.

        Args:
            entries: a batch (up to ``SINK_BATCH`` per stream), in id order per stream. It
                may hold entries written before (a replay after a crash): write each at
                most once, or overwrite idempotently.

        Raises:
            Exception: anything, when not all of the batch is durable. Nothing is
                acknowledged; the same entries come again (retried after a delay).
        """

    def idle(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Called when a read found nothing new and everything written is acknowledged (a
        point to rotate or flush by age). Does nothing by default."""

    def close(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Called once at a clean stop, after the last batch was written and acknowledged.
        Does nothing by default."""
