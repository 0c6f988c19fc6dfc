"""Messages that outlived their queue's TTL: their fingerprint is released from the seen-set, so
a producer can enqueue the URL again, and they are counted (``expired``, ``released``). A job's
message releases its run's fingerprint (common.core.urls.job_fingerprint) and is counted in
the run's counters (``expired``) only if that fingerprint was really released: an expired
copy of a URL the run already forgot is not a second outcome."""

from __future__ import annotations

import logging

from common.broker.messages import WorkMessage
from common.core.errors import BadMessage, InvalidURL
from common.core.redact import clip
from common.core.urls import Fingerprint, canonicalize, identity_url, job_fingerprint
from common.jobs.registry import JobRef
from common.store.dedupe import SeenSet
from common.store.keys import COUNTERS, job_run_key
from common.store.slots import GIVEN_LUA, absent, bucket_shard, part, refuse_on_cluster
from common.work.outcome import Outcome

logger = logging.getLogger(__name__)

# On a cluster all in the bucket's shard (an absent key its bare tag, common/store/slots.py).
# KEYS[1] crawled_urls:{b} ('' = nothing to release)  KEYS[2] stats:counters
# KEYS[3] job:{name}:run:{n} ('' = the default job)  ARGV[1] the fingerprint's member
# Returns 1 when the fingerprint was released; the run counts it only then.
RELEASE_LUA = GIVEN_LUA + """
local released = 0
if given(KEYS[1]) then released = redis.call('SREM', KEYS[1], ARGV[1]) end
redis.call('HINCRBY', KEYS[2], 'expired', 1)
redis.call('HINCRBY', KEYS[2], 'released', released)
if released == 1 and given(KEYS[3]) then redis.call('HINCRBY', KEYS[3], 'expired', 1) end
return released
"""


def release_expired(body: bytes, seen: SeenSet) -> Outcome:
    """Release the fingerprint of an expired message and count it (one round trip)."""
    try:
        message = WorkMessage.from_json(body)
    except BadMessage as exc:
        seen.client.hincrby(COUNTERS, "expired", 1)
        return Outcome("released", "<unparsable>", detail=f"expired bad message: {exc}")
    job = JobRef.of(message.extra)
    fp = _fingerprint_of(message, job)
    shard = bucket_shard(fp.bucket(seen.buckets) if fp is not None else 0)
    if job is not None:
        refuse_on_cluster("a job's expired message")
    seen.client.eval(RELEASE_LUA, 3, seen.key(fp) if fp is not None else absent(shard),
                     part(COUNTERS, shard),
                     job_run_key(job.name, job.run) if job is not None else absent(shard),
                     fp.member if fp is not None else 0)
    return Outcome("released", message.url, detail="expired; fingerprint released")


def _fingerprint_of(message: WorkMessage, job: JobRef | None) -> Fingerprint | None:
    """The message's own fingerprint (the producer wrote its run's), else computed."""
    if message.fp:
        try:
            return Fingerprint(bytes.fromhex(message.fp))
        except ValueError:
            logger.warning("bad fingerprint %s in an expired message", clip(repr(message.fp)))
    try:
        return job_fingerprint(identity_url(canonicalize(message.url), "media" in message.extra),
                               job.scope if job is not None else None)
    except InvalidURL:
        return None
