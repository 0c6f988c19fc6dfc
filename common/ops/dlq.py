"""Dead-letter queue tools: list, replay, purge ``failed_urls``.

Listing is non-destructive: messages are fetched with ``basic_get`` (manual ack) and never
acked, so closing the channel puts every one back where it was. Replay takes the matching
messages, resets each URL's retry counter (``failures:{url}``), releases its fingerprint, and
sends it through the producer path again (canonicalise → dedupe → route → confirmed
publish); only once that publish is confirmed is the dead letter acked. The fleet's robots.txt
failures ("unavailable", "failed") of the replayed URLs' origins are deleted first, so a
replay after a fix (the CA trusted, the site back) fetches robots.txt afresh at once.

A dead letter's body may hold anything (a poison message): what is listed is escaped where
standard output cannot encode it (a lone surrogate from a ``\\ud800`` in the JSON, any
non-ASCII character on an ASCII terminal) as backslash escapes, so ``dlq list`` prints every
letter; replay uses the URL as the body holds it.

A job's dead letter carries its job and run in its body (``job``, ``run``): ``list --job``
and ``replay --job`` pick them. Replaying one forgets its run's done mark and seen fingerprint
(both scoped to the run, common/core/urls.py ``job_fingerprint``) and republishes it into that
run, only while the run is the job's running one: a letter of a paused, ended or older run is
refused and stays in the queue (its run has counted it as failed; a new run seeds afresh).
What the letter counted in its run (``known``, ``failed``, ``failed:{reason}``) is taken back
as its marks go, so the run's counters stay exact and its ``limits.pages`` is not spent twice
on one URL.

On a Redis Cluster the default job's letters are replayed as on one node (each call's keys in
one hash slot: the robots entries one script call per slot, docs/design-redis-cluster.md); a
job's letters are refused there and stay in the queue, as jobs do not run on a cluster.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pika
import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import BadMessage, InvalidURL
from common.core.urls import canonicalize, fingerprint, job_fingerprint
from common.intake.producer import Producer, ProduceSummary
from common.jobs.registry import JobRef, JobRegistry, JobStateError
from common.store import slots
from common.store.dedupe import DoneSet, SeenSet
from common.store.keys import failures_key, job_run_key
from common.web.robots import forget_failures, origin_of


@dataclass(frozen=True)
class DeadLetter:
    """``url`` is for showing (:func:`_shown`), ``raw_url`` as the body holds it (replay)."""

    url: str
    reason: str
    headers: dict[str, Any]
    body: bytes
    raw_url: str = ""
    job: JobRef | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "reason": self.reason,
                **({"job": self.job.name, "run": self.job.run} if self.job else {}),
                **{k: _shown(_plain(v)) for k, v in self.headers.items() if k != "reason"}}

    def of(self, job: str | None, run: int | None = None) -> bool:
        """Whether it is a dead letter of ``job`` (None: any) and ``run`` (None: any)."""
        if job is None:
            return True
        return (self.job is not None and self.job.name == job
                and (run is None or self.job.run == run))


@dataclass
class ReplaySummary:
    matched: int = 0
    skipped_unreplayable: int = 0
    produced: ProduceSummary = field(default_factory=ProduceSummary)
    #: letters of a run that is not running (any job's on a cluster), left in the queue:
    #: why, and how many
    refused: dict[str, int] = field(default_factory=dict)


def _plain(value: Any) -> Any:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _shown(value: Any) -> Any:
    """A str as standard output can print it: what its encoding cannot hold (a lone surrogate
    anywhere, non-ASCII on an ASCII terminal) as backslash escapes; other values unchanged."""
    if not isinstance(value, str):
        return value
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        codecs.lookup(encoding)
    except LookupError:  # an encoding Python does not know: UTF-8 is what is written then
        encoding = "utf-8"
    try:
        value.encode(encoding)
    except UnicodeEncodeError:  # what the terminal cannot print becomes backslash escapes
        return value.encode(encoding, "backslashreplace").decode(encoding)
    return value


def _decode(body: bytes, headers: dict[str, Any] | None) -> DeadLetter:
    headers = dict(headers or {})
    job = None
    try:
        message = WorkMessage.from_json(body)
        url, job = message.url, JobRef.of(message.extra)
    except BadMessage:
        url = "<unparsable>"
    return DeadLetter(url=_shown(url), reason=_shown(str(_plain(headers.get("reason", "unknown")))),
                      headers=headers, body=body, raw_url=url, job=job)


def browse(connection: pika.BlockingConnection, limit: int | None = None, *,
           job: str | None = None, run: int | None = None) -> list[DeadLetter]:
    """Up to ``limit`` dead letters (of ``job`` and ``run`` when given), oldest first, leaving
    the queue as it was."""
    channel = connection.channel()
    try:
        out = []
        while limit is None or len(out) < limit:
            method, props, body = channel.basic_get(topology.FAILED_QUEUE, auto_ack=False)
            if method is None:
                break
            letter = _decode(body, props.headers)
            if letter.of(job, run):
                out.append(letter)
        return out
    finally:
        channel.close()  # unacked messages go back to the queue in their order


def count_by_reason(letters: list[DeadLetter]) -> dict[str, int]:
    return dict(Counter(letter.reason for letter in letters).most_common())


def replay(settings: Settings, connection: pika.BlockingConnection, client: redis.Redis,
           *, reason: str | None = None, limit: int | None = None,
           job: str | None = None) -> ReplaySummary:
    """Send matching dead letters back through routing, each into its own job's run (the
    default job's as before); ack each once it is re-published. ``job``: that job's only.

    A job's letter is replayed only while its run is the job's running one, and never on a
    Redis Cluster; the others stay in the queue, counted in ``refused`` by why.
    """
    summary = ReplaySummary()
    channel = connection.channel()
    groups: dict[JobRef | None, list[tuple[int, str, str]]] = {}
    registry = JobRegistry(client)
    refusals: dict[JobRef, str | None] = {}
    try:
        while limit is None or summary.matched < limit:
            method, props, body = channel.basic_get(topology.FAILED_QUEUE, auto_ack=False)
            if method is None:
                break
            letter = _decode(body, props.headers)
            if (reason is not None and letter.reason != reason) or not letter.of(job):
                continue  # stays unacked: back in the queue when the channel closes
            if letter.raw_url == "<unparsable>":
                summary.skipped_unreplayable += 1
                continue
            if letter.job is not None:
                if letter.job not in refusals:
                    refusals[letter.job] = _refusal(registry, letter.job)
                why = refusals[letter.job]
                if why is not None:
                    summary.refused[why] = summary.refused.get(why, 0) + 1
                    continue
            groups.setdefault(letter.job, []).append(
                (method.delivery_tag, letter.raw_url,
                 str(_plain((props.headers or {}).get("reason", "unknown")))))
            summary.matched += 1
        if not groups:
            return summary
        forget_failures(client, _origins(
            (url for matched in groups.values() for _tag, url, _why in matched), settings))
        with Producer(settings, client) as producer:
            for ref, matched in groups.items():
                if ref is not None:
                    _into_run(settings, client, producer, registry, ref, matched, channel,
                              summary)
                    continue
                _forget([url for _tag, url, _why in matched], settings, client)
                produced = producer.submit(url for _tag, url, _why in matched)
                summary.produced.merge(produced)
                if produced.failed == 0:
                    for tag, _url, _why in matched:
                        channel.basic_ack(tag)
        return summary
    finally:
        channel.close()


# The run no longer knows the replayed URLs: each one's seen fingerprint and done mark (the
# run's) go, and what they counted with them (known; failed and failed:{reason}), so the run's
# counters stay exact and its limits.pages is not spent twice on one URL: the producer counts
# the URL known again as it publishes it, the worker its new outcome.
# KEYS[1] job:{name}:run:{n}; KEYS[2i], KEYS[2i+1] letter i's seen and done buckets.
# ARGV[3i-2], ARGV[3i-1] its seen and done members, ARGV[3i] its reason. Returns per letter
# 2 * (seen removed) + (done mark removed), what UNDO_LUA puts back.
FORGET_LUA = """
local out = {}
for i = 1, (#KEYS - 1) / 2 do
  local seen = redis.call('SREM', KEYS[2 * i], ARGV[3 * i - 2])
  local done = redis.call('SREM', KEYS[2 * i + 1], ARGV[3 * i - 1])
  if seen == 1 then redis.call('HINCRBY', KEYS[1], 'known', -1) end
  if done == 1 then
    redis.call('HINCRBY', KEYS[1], 'failed', -1)
    redis.call('HINCRBY', KEYS[1], 'failed:' .. ARGV[3 * i], -1)
  end
  out[i] = seen * 2 + done
end
return out
"""
# A letter not published after all (a failed publish, over limits.pages): as it was. KEYS as
# FORGET_LUA's; ARGV[4i-3..4i] its seen and done members, reason, FORGET_LUA's answer.
UNDO_LUA = """
for i = 1, (#KEYS - 1) / 2 do
  local removed = tonumber(ARGV[4 * i])
  if removed >= 2 and redis.call('SADD', KEYS[2 * i], ARGV[4 * i - 3]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'known', 1)
  end
  if removed % 2 == 1 and redis.call('SADD', KEYS[2 * i + 1], ARGV[4 * i - 2]) == 1 then
    redis.call('HINCRBY', KEYS[1], 'failed', 1)
    redis.call('HINCRBY', KEYS[1], 'failed:' .. ARGV[4 * i - 1], 1)
  end
end
return 1
"""


def _into_run(settings: Settings, client: redis.Redis, producer: Producer,
              registry: JobRegistry, ref: JobRef, matched: list[tuple[int, str, str]],
              channel: Any, summary: ReplaySummary) -> None:
    """Republish a running run's dead letters into it; ack each one the run now knows again
    (seen after the publish: published, or meanwhile by a page of the run), leave the others
    in the queue as they were (counters and marks put back)."""
    seen, done = SeenSet(client, settings.seen_buckets), DoneSet(client, settings.seen_buckets)
    letters = []
    for tag, url, why in matched:
        try:
            canonical = canonicalize(url, max_length=settings.max_url_length)
        except InvalidURL:
            summary.skipped_unreplayable += 1
            continue
        fp, mark = job_fingerprint(canonical, ref.scope), done.mark_for(canonical,
                                                                        scope=ref.scope)
        letters.append((tag, canonical, why, fp, mark))
    if not letters:
        return
    keys = [job_run_key(ref.name, ref.run)]
    args: list[Any] = []
    for _tag, _url, why, fp, mark in letters:
        keys += [seen.key(fp), mark.key]
        args += [fp.member, mark.member, why]
    client.delete(*(failures_key(url) for _tag, url, *_rest in letters))
    removed = client.register_script(FORGET_LUA)(keys=keys, args=args)
    summary.produced.merge(producer.submit((url for _tag, url, *_rest in letters), job=ref,
                                           job_spec=registry.spec(ref.name)))
    known = seen.contains_many([fp for *_rest, fp, _mark in letters])
    undo: list[Any] = []
    undo_keys = keys[:1]
    for (tag, _url, why, fp, mark), is_known, flags in zip(letters, known, removed,
                                                          strict=True):
        if is_known:
            channel.basic_ack(tag)
            continue
        undo_keys += [seen.key(fp), mark.key]
        undo += [fp.member, mark.member, why, flags]
        why_not = f"not published into run {ref.run} of job {ref.name} (failed or over " \
                  "limits.pages)"
        summary.refused[why_not] = summary.refused.get(why_not, 0) + 1
        summary.matched -= 1
    if undo:
        client.register_script(UNDO_LUA)(keys=undo_keys, args=undo)


def _refusal(registry: JobRegistry, ref: JobRef) -> str | None:
    """Why a dead letter of ``ref`` cannot go back into its run; None when it can."""
    if slots.cluster():  # a run's counters are fleet-wide: FORGET_LUA would be CROSSSLOT
        return f"job {ref.name}: {slots.NO_JOBS_ON_CLUSTER}"
    try:
        state = registry.state(ref.name)
    except JobStateError:
        return f"job {ref.name} no longer exists"
    if state.run != ref.run:
        return f"run {ref.run} of job {ref.name} is over (the job is at run {state.run})"
    if state.state != "running":
        return f"run {ref.run} of job {ref.name} is {state.state}, not running"
    return None


def _forget(urls: list[str], settings: Settings, client: redis.Redis) -> None:
    """Reset retry counters and release fingerprints and done marks, so replayed URLs count
    as new (the default job's; a run's: FORGET_LUA)."""
    canonical = []
    for url in urls:
        try:
            canonical.append(canonicalize(url, max_length=settings.max_url_length))
        except InvalidURL:
            continue  # goes back to the DLQ as invalid_url through the producer
    if canonical:  # a cluster client splits the DEL by slot, the SREM pipelines by node
        client.delete(*(failures_key(url) for url in canonical))
        SeenSet(client, settings.seen_buckets).remove_many([fingerprint(u) for u in canonical])
        DoneSet(client, settings.seen_buckets).forget(canonical)


def _origins(urls: Iterable[str], settings: Settings) -> set[str]:
    """The origins (robots.txt's scope) of ``urls`` as the workers will see them."""
    origins = set()
    for url in urls:
        try:
            origins.add(origin_of(canonicalize(url, max_length=settings.max_url_length)))
        except InvalidURL:
            continue  # goes back to the DLQ as invalid_url through the producer
    return origins


def purge(connection: pika.BlockingConnection) -> int:
    channel = connection.channel()
    try:
        return channel.queue_purge(topology.FAILED_QUEUE).method.message_count
    finally:
        channel.close()


def to_json_lines(letters: list[DeadLetter]) -> str:
    return "\n".join(json.dumps(letter.as_dict(), default=str) for letter in letters)
