"""Reading what the files sink left in a directory (shared by the sink tests)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from common.sink.files import FINAL_PREFIX, FINAL_SUFFIX, PART_PREFIX


def finalized(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{FINAL_PREFIX}*{FINAL_SUFFIX}"))


def open_parts(directory: Path) -> list[Path]:
    return sorted(directory.glob(f"{PART_PREFIX}*"))


def lines(directory: Path) -> list[dict[str, Any]]:
    """Every line of every finalized part (gzip reads a multi-member file as one)."""
    out: list[dict[str, Any]] = []
    for path in finalized(directory):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            out += [json.loads(line) for line in handle]
    return out


def stream_ids(client: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """(stream, id) -> record of every entry now in ``results`` and ``failures``."""
    out = {}
    for stream in ("results", "failures"):
        for raw_id, fields in client.xrange(stream):
            out[(stream, raw_id.decode())] = json.loads(fields[b"json"])
    return out
