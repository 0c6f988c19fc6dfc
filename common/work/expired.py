"""Messages that outlived their queue's TTL: their fingerprint is released from the seen-set, so
a producer can enqueue the URL again, and they are counted (``expired``, ``released``)."""

from __future__ import annotations

import logging

from common.broker.messages import WorkMessage
from common.core.errors import BadMessage, InvalidURL
from common.core.redact import clip
from common.core.urls import Fingerprint, canonicalize, fingerprint
from common.store.dedupe import SeenSet
from common.store.keys import COUNTERS
from common.work.outcome import Outcome

logger = logging.getLogger(__name__)


def release_expired(body: bytes, seen: SeenSet) -> Outcome:
    """Release the fingerprint of an expired message and count it (one round trip)."""
    try:
        message = WorkMessage.from_json(body)
    except BadMessage as exc:
        seen.client.hincrby(COUNTERS, "expired", 1)
        return Outcome("released", "<unparsable>", detail=f"expired bad message: {exc}")
    fp = _fingerprint_of(message)
    released = seen.remove_many([fp]) if fp is not None else 0
    pipe = seen.client.pipeline(transaction=False)
    pipe.hincrby(COUNTERS, "expired", 1)
    pipe.hincrby(COUNTERS, "released", released)
    pipe.execute()
    return Outcome("released", message.url, detail="expired; fingerprint released")


def _fingerprint_of(message: WorkMessage) -> Fingerprint | None:
    if message.fp:
        try:
            return Fingerprint(bytes.fromhex(message.fp))
        except ValueError:
            logger.warning("bad fingerprint %s in an expired message", clip(repr(message.fp)))
    try:
        return fingerprint(canonicalize(message.url))
    except InvalidURL:
        return None
