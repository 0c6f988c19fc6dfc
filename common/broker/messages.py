"""The work message: persistent JSON on the wire, never pickle.

    {"url": "https://…", "enqueued_at": 1732230000.123, "depth": 0, "attempts": 0,
     "fp": "32 hex chars"}

``url`` is canonical. ``fp`` is the seen-set fingerprint, carried so that an expired message can
release it without re-canonicalising. Unknown fields are kept (forward compatibility).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from common.core.errors import BadMessage


@dataclass(frozen=True)
class WorkMessage:
    url: str
    enqueued_at: float = field(default_factory=time.time)
    depth: int = 0
    attempts: int = 0
    fp: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        body: dict[str, Any] = dict(self.extra)
        body.update(url=self.url, enqueued_at=self.enqueued_at, depth=self.depth,
                    attempts=self.attempts)
        if self.fp:
            body["fp"] = self.fp
        return json.dumps(body, separators=(",", ":")).encode("utf-8")

    @classmethod
    def from_json(cls, body: bytes) -> WorkMessage:
        """Decode a message body.

        Raises:
            BadMessage: not UTF-8 JSON, not an object, or fields of the wrong type.
        """
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise BadMessage(f"body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadMessage(f"body is JSON {type(data).__name__}, not an object")
        url = data.pop("url", None)
        if not isinstance(url, str) or not url:
            raise BadMessage("missing or non-string 'url'")
        enqueued_at = data.pop("enqueued_at", None)
        depth = data.pop("depth", 0)
        attempts = data.pop("attempts", 0)
        fp = data.pop("fp", None)
        if enqueued_at is not None and not isinstance(enqueued_at, int | float):
            raise BadMessage("'enqueued_at' must be a number")
        for name, value in (("depth", depth), ("attempts", attempts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise BadMessage(f"'{name}' must be a non-negative integer")
        if fp is not None and not isinstance(fp, str):
            raise BadMessage("'fp' must be a string")
        return cls(url=url, enqueued_at=float(enqueued_at or 0.0), depth=depth,
                   attempts=attempts, fp=fp, extra=data)
