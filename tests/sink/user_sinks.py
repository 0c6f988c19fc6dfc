"""Sinks as a user writes them, run by ``scrape-fleet sink`` in tests/sink/test_plugins.py
(``SINK=tests.sink.user_sinks:JsonLinesSink``): JSON Lines in one file, and variants that
fail, die mid-batch or are no sink at all."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from scrape_fleet.sinks import Entry, Sink

#: The file every sink here writes, in SINK_DIR (``--dir``).
FILE_NAME = "sink.jsonl"


class JsonLinesSink(Sink):
    """One JSON line per entry (``stream``, ``id``, ``url``), appended and fsynced per batch.
    Idempotent: it learns the highest id per stream from the file at start and skips
    replayed entries at or below it."""

    name = "jsonl"

    def __init__(self, directory: str) -> None:
        self.path = Path(directory) / FILE_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.high: dict[str, tuple[int, int]] = {}
        for line in read_lines(self.path):
            entry = Entry(line["stream"], line["id"], {})
            self.high[entry.stream] = max(self.high.get(entry.stream, (-1, -1)), entry.position)
        self.writes = 0

    @classmethod
    def from_settings(cls, settings: Any, name: str) -> JsonLinesSink:
        return cls(settings.sink_dir)

    def write(self, entries: list[Entry]) -> None:
        self.writes += 1
        fresh = [e for e in entries if e.position > self.high.get(e.stream, (-1, -1))]
        self._append(fresh)
        for entry in fresh:
            self.high[entry.stream] = max(self.high.get(entry.stream, (-1, -1)), entry.position)

    def _append(self, entries: list[Entry]) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            for entry in entries:
                handle.write(json.dumps({"stream": entry.stream, "id": entry.id,
                                         "url": entry.record.get("url")}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())


class FailingSink(JsonLinesSink):
    """Its store is down: every write raises (same registered name, so a restart with
    :class:`JsonLinesSink` gets its pending entries)."""

    def write(self, entries: list[Entry]) -> None:
        raise ConnectionError(f"store unreachable ({len(entries)} entries not written)")


class DyingSink(JsonLinesSink):
    """Killed (SIGKILL, by itself) in the middle of its second batch: half of it is in the
    file and fsynced, nothing of it acknowledged."""

    def write(self, entries: list[Entry]) -> None:
        if self.writes == 1:
            self._append(entries[: len(entries) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        super().write(entries)


class NotASink:
    """Has no write method."""

    def close(self) -> None:
        """Nothing to close."""


class HalfDone(Sink):
    """Subclasses Sink but never implements write."""


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The lines of a sink's file (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
