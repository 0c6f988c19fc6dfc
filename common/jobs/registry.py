"""The jobs of a fleet in Redis: their definitions, states, runs and counters.

Keys (common/store/keys.py): ``jobs`` (name → definition), ``job:{name}`` (state),
``job:{name}:seeds``, ``job:{name}:run:{n}`` (a run's counters), ``job:{name}:parked``,
``jobs:version``. Every change of a definition or a state is one MULTI or one Lua script that
also bumps ``jobs:version``, which the workers watch (their admit script returns it), so a
submitted, paused or cancelled job is seen by the next page any worker admits.

Lifecycle::

    created ──start_run──▶ running ◀──resume── paused
                             │  └────pause────▶   │
                             ├──finish──▶ finished ──start_run (a schedule's next run)──▶ running
                             └──cancel (also from created and paused)──▶ cancelled

A message carries its job as ``job`` and ``run`` (:class:`JobRef`); one whose run is not the
job's current running run is dropped by the worker as cancelled (common/web/ratelimit.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import redis

from common.jobs.spec import DEFAULT_JOB, JobSpec
from common.store.keys import (
    JOBS,
    JOBS_LAST_RUNS,
    JOBS_VERSION,
    deferred_key,
    job_key,
    job_parked_key,
    job_run_key,
    job_seeds_key,
)

STATES = ("created", "running", "paused", "finished", "cancelled")
ENDED = ("finished", "cancelled")
#: What a run's outcomes are: each URL the run knows ends in exactly one of them.
OUTCOMES = ("results", "assets", "failed", "cancelled", "expired")  # assets: common/media/


class JobStateError(ValueError):
    """A lifecycle command that does not apply to the job's state (or an unknown job)."""


@dataclass(frozen=True, slots=True)
class JobRef:
    """Which run of which job a message belongs to."""

    name: str
    run: int

    @property
    def scope(self) -> str:
        """What its URLs are deduped within (common.core.urls.job_fingerprint)."""
        return f"{self.name}/{self.run}"

    def fields(self) -> dict[str, Any]:
        """The message and record fields that carry it."""
        return {"job": self.name, "run": self.run}

    @classmethod
    def of(cls, extra: dict[str, Any]) -> JobRef | None:
        """The job of a message's fields; None for the default job (or malformed fields,
        which the worker's decode step refuses before)."""
        name, run = extra.get("job"), extra.get("run")
        if isinstance(name, str) and name and name != DEFAULT_JOB and type(run) is int:
            return cls(name, run)
        return None


@dataclass(frozen=True)
class JobState:
    name: str
    state: str
    run: int = 0
    reason: str = ""
    submitted: int = 0  # ms
    started: int = 0
    ended: int = 0
    next_run: int = 0  # ms; 0: none planned
    seeded: int = 0  # the run whose seeds are all published

    @property
    def ref(self) -> JobRef | None:
        return JobRef(self.name, self.run) if self.run else None

    @classmethod
    def from_hash(cls, name: str, raw: dict[bytes, bytes]) -> JobState:
        text = {k.decode(): v.decode() for k, v in raw.items()}
        return cls(name=name, state=text.get("state", "created"),
                   reason=text.get("reason", ""),
                   **{f: int(text.get(f, 0) or 0) for f in
                      ("run", "submitted", "started", "ended", "next_run", "seeded")})


# KEYS[1] job:{name}  KEYS[2] jobs:version  KEYS[3] job:{name}:run:{run} of the new run is
# derived in Lua. ARGV[1] now ms  ARGV[2] run-key prefix "job:{name}:run:"
# created|finished -> running with run + 1 (a schedule's next run). Returns the new run, or
# an error naming the state.
START_LUA = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return redis.error_reply('no such job') end
if state ~= 'created' and state ~= 'finished' then
  return redis.error_reply('the job is ' .. state)
end
local run = redis.call('HINCRBY', KEYS[1], 'run', 1)
redis.call('HSET', KEYS[1], 'state', 'running', 'started', ARGV[1], 'ended', 0,
           'reason', '', 'next_run', 0)
redis.call('HSET', ARGV[2] .. run, 'started', ARGV[1])
redis.call('INCR', KEYS[2])
return run
"""

# KEYS[1] job:{name}  KEYS[2] jobs:version  KEYS[3] job:{name}:parked  KEYS[4] deferred
# KEYS[5] deferred:counts  ARGV[1] action (pause|resume|cancel|finish)  ARGV[2] now ms
# ARGV[3] reason  ARGV[4] run-key prefix  ARGV[5] run ('' = any; finish: only that run)
# pause: running -> paused. resume: paused -> running, the parked messages moved to deferred
# (due now). cancel: created|running|paused -> cancelled, the parked messages dropped and
# counted cancelled. finish: running (that run) -> finished. Returns the new state.
MOVE_LUA = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return redis.error_reply('no such job') end
local run = redis.call('HGET', KEYS[1], 'run')
local action = ARGV[1]
local to
if action == 'pause' and state == 'running' then to = 'paused'
elseif action == 'resume' and state == 'paused' then to = 'running'
elseif action == 'cancel' and (state == 'created' or state == 'running' or state == 'paused')
  then to = 'cancelled'
elseif action == 'finish' and state == 'running' and run == ARGV[5] then to = 'finished'
else return redis.error_reply('cannot ' .. action .. ' a job that is ' .. state) end
redis.call('HSET', KEYS[1], 'state', to)
if to == 'cancelled' or to == 'finished' then
  redis.call('HSET', KEYS[1], 'ended', ARGV[2], 'reason', ARGV[3], 'next_run', 0)
  redis.call('HSET', ARGV[4] .. run, 'ended', ARGV[2])
end
if to == 'cancelled' then
  local parked = redis.call('ZCARD', KEYS[3])
  if parked > 0 then
    redis.call('HINCRBY', ARGV[4] .. run, 'cancelled', parked)
    redis.call('DEL', KEYS[3])
  end
elseif to == 'running' then
  local members = redis.call('ZRANGE', KEYS[3], 0, -1)
  for _, member in ipairs(members) do
    redis.call('ZADD', KEYS[4], ARGV[2], member)
    local domain = string.match(member, '^(%S+)')
    redis.call('HINCRBY', KEYS[5], domain, 1)
  end
  redis.call('DEL', KEYS[3])
end
redis.call('INCR', KEYS[2])
return to
"""


class JobRegistry:
    """The fleet's jobs; borrows a Redis client."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self._start = client.register_script(START_LUA)
        self._move = client.register_script(MOVE_LUA)

    # -- definitions -------------------------------------------------------------------------
    def submit(self, spec: JobSpec, *, replace: bool = False) -> JobState:
        """Store a validated job as ``created`` (its definition, seeds and state in one
        MULTI). ``replace``: a job of that name that is not running or paused is replaced
        (its runs' counters stay; its next run starts from run + 1).

        Raises:
            JobStateError: the name is taken (without ``replace``), or that job is active.
        """
        now = _now_ms()
        with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(job_key(spec.name), JOBS_LAST_RUNS)
                    current = pipe.hgetall(job_key(spec.name))
                    last_run = int(pipe.hget(JOBS_LAST_RUNS, spec.name) or 0)
                    if current:
                        state = current.get(b"state", b"").decode()
                        if not replace:
                            raise JobStateError(f"job {spec.name!r} exists ({state}): "
                                                "`job submit --replace` or `job delete` first")
                        if state not in ("created", *ENDED):
                            raise JobStateError(f"job {spec.name!r} is {state}: cancel it "
                                                "before replacing it")
                    pipe.multi()
                    pipe.hset(JOBS, spec.name, spec.to_json())
                    pipe.delete(job_seeds_key(spec.name))
                    for chunk in _chunks(spec.seed_urls, 10_000):
                        pipe.rpush(job_seeds_key(spec.name), *chunk)
                    pipe.hset(job_key(spec.name), mapping={
                        "state": "created", "submitted": now, "started": 0, "ended": 0,
                        "reason": "", "next_run": 0, "seeded": current.get(b"seeded", 0)
                        if current else 0})
                    if not current:  # a deleted job's name goes on from its last run
                        pipe.hset(job_key(spec.name), "run", last_run)
                    pipe.incr(JOBS_VERSION)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
        return self.state(spec.name)

    def spec(self, name: str, *, with_seeds: bool = False) -> JobSpec | None:
        raw = self.client.hget(JOBS, name)
        if raw is None:
            return None
        seeds = tuple(u.decode() for u in self.client.lrange(job_seeds_key(name), 0, -1)
                      ) if with_seeds else ()
        return JobSpec.from_json(raw, seeds)

    def specs(self) -> dict[str, JobSpec]:
        """Every job's definition (without seed URLs): what a worker's job book holds."""
        return {k.decode(): JobSpec.from_json(v) for k, v in self.client.hgetall(JOBS).items()}

    def version(self) -> int:
        return int(self.client.get(JOBS_VERSION) or 0)

    # -- states ------------------------------------------------------------------------------
    def state(self, name: str) -> JobState:
        """Raises JobStateError for an unknown job."""
        raw = self.client.hgetall(job_key(name))
        if not raw:
            raise JobStateError(f"no job named {name!r} (`scrape-fleet job list`)")
        return JobState.from_hash(name, raw)

    def states(self) -> list[JobState]:
        names = sorted(k.decode() for k in self.client.hkeys(JOBS))
        with self.client.pipeline(transaction=False) as pipe:
            for name in names:
                pipe.hgetall(job_key(name))
            raws = pipe.execute()
        return [JobState.from_hash(n, r) for n, r in zip(names, raws, strict=True) if r]

    def start_run(self, name: str) -> JobRef:
        """created or finished → running, as run + 1. Raises JobStateError otherwise."""
        try:
            run = self._start(keys=[job_key(name), JOBS_VERSION],
                              args=[_now_ms(), f"job:{name}:run:"])
        except redis.ResponseError as exc:
            raise JobStateError(f"cannot start job {name!r}: {exc}") from None
        return JobRef(name, int(run))

    def pause(self, name: str) -> str:
        return self._transition(name, "pause")

    def resume(self, name: str) -> str:
        return self._transition(name, "resume")

    def cancel(self, name: str, reason: str = "cancelled by a user") -> str:
        return self._transition(name, "cancel", reason)

    def finish(self, ref: JobRef, reason: str = "nothing left") -> str:
        return self._transition(ref.name, "finish", reason, ref.run)

    def _transition(self, name: str, action: str, reason: str = "",
                    run: int | None = None) -> str:
        try:
            to = self._move(keys=[job_key(name), JOBS_VERSION, job_parked_key(name),
                                  deferred_key(), deferred_key("counts")],
                            args=[action, _now_ms(), reason, f"job:{name}:run:",
                                  "" if run is None else run])
        except redis.ResponseError as exc:
            raise JobStateError(f"job {name!r}: {exc}") from None
        return to.decode() if isinstance(to, bytes) else str(to)

    def mark_seeded(self, ref: JobRef) -> None:
        """Every seed of this run is published (the runner's last seeding step)."""
        self.client.hset(job_key(ref.name), "seeded", ref.run)

    def plan_next(self, name: str, at_ms: int) -> None:
        """A scheduled job's next run time (after a run finished)."""
        self.client.hset(job_key(name), "next_run", at_ms)

    def delete(self, name: str) -> None:
        """Forget a job that is not running or paused: its definition, state, seeds, parked
        messages and every run's counters (its results stay in the streams and sinks).

        Raises:
            JobStateError: unknown, or still active (cancel it first).
        """
        state = self.state(name)
        if state.state in ("running", "paused"):
            raise JobStateError(f"job {name!r} is {state.state}: cancel it first")
        keys = [job_key(name), job_seeds_key(name), job_parked_key(name),
                *(job_run_key(name, n) for n in range(1, state.run + 1))]
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hdel(JOBS, name)
            pipe.hset(JOBS_LAST_RUNS, name, state.run)
            for chunk in _chunks(keys, 1000):
                pipe.delete(*chunk)
            pipe.incr(JOBS_VERSION)
            pipe.execute()

    # -- counters ----------------------------------------------------------------------------
    def counters(self, ref: JobRef) -> dict[str, int]:
        """A run's counters (known, results, failed, failed:{reason}, cancelled, expired,
        paused, bytes, started, ended)."""
        raw = self.client.hgetall(job_run_key(ref.name, ref.run))
        return {k.decode(): int(v) for k, v in raw.items()}


def outcomes(counters: dict[str, int]) -> int:
    """How many of a run's URLs have their one outcome."""
    return sum(counters.get(name, 0) for name in OUTCOMES)


def _chunks(items: Iterable[Any], size: int) -> Iterable[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _now_ms() -> int:
    return int(time.time() * 1000)


def dumps(state: JobState) -> str:
    return json.dumps(state.__dict__, sort_keys=True)
