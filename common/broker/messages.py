"""The work message: persistent JSON on the wire, never pickle.

    {"url": "https://…", "enqueued_at": 1732230000.123, "depth": 0, "attempts": 0,
     "fp": "32 hex chars"}

``url`` is canonical. ``fp`` is the seen-set fingerprint, carried so that an expired message can
release it without re-canonicalising. Unknown fields are kept (forward compatibility).

Every number in a message is finite: ``NaN``, ``Infinity`` (which Python's json accepts) and
numbers beyond a float's range (``1e400``, a 400-digit integer) are refused anywhere in the
body as a :class:`BadMessage`, so no wait (``not_before``, ``parked_at``) can be NaN or
endless (issue 23).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from common.core.errors import BadMessage

#: Longest integer accepted, in digits: anything longer is beyond a float (1.8e308), so it could
#: not be compared with a time.
MAX_INT_DIGITS = 308


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadMessage(f"number {text[:40]!r} is not a finite float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise BadMessage(f"number of {len(text)} digits is beyond a float's range")
    return int(text)


def _no_constant(text: str) -> Any:
    raise BadMessage(f"number {text} is not finite")


#: Built once: json.loads with hooks would build a decoder per message.
_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_int=_bounded_int,
                            parse_constant=_no_constant)


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
            BadMessage: not UTF-8 JSON, not an object, a number that is not finite
                anywhere in it, or fields of the wrong type.
        """
        try:  # what json.loads does with bytes, through the decoder that refuses non-finite
            data = _DECODER.decode(body.decode(json.detect_encoding(body), "surrogatepass"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError too
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
