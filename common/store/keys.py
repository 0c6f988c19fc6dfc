"""Redis key schema — every key this project touches is built here.

    crawled_urls:{b}         SET of signed 64-bit integers. The seen-set, split into
                             SEEN_BUCKETS small sets so each stays an intset (8 bytes a
                             member). A URL's 128-bit fingerprint picks bucket ``b`` (hex) with
                             its top bits and stores the next 64 bits. NOTES.md #4.
    done:{b}                 SET of signed 64-bit integers, same layout as crawled_urls: URLs
                             whose outcome (one result or one dead letter) is recorded. A
                             redelivered message of a done URL is acked without a second
                             result (kill -9, lost acks). NOTES.md #14.
    results                  STREAM, one entry per fetched URL (field ``json``). Capped with an
                             approximate MAXLEN (RESULTS_MAXLEN) while no sink is registered;
                             with sinks, trimmed below what every sink acknowledged. Each
                             sink reads it through its consumer group ``sink:{name}``.
    failures                 STREAM, one failure record per dead-lettered URL (field ``json``),
                             appended once the dead letter is confirmed; capped and read by
                             the sinks like ``results``.
    assets                   STREAM, one asset record per downloaded media request (field
                             ``json``; common/media/), read by the sinks like ``results``.
    sinks                    SET of registered result sink names (a sink's group is
                             ``sink:{name}``); SREM and XGROUP DESTROY to retire one.
    stats:counters           HASH of fleet-wide counters (HINCRBY): cache_hits, cache_misses,
                             expired, released, retries, robots_blocked, rate_limited,
                             replica_waits (a repeated WAIT for REDIS_MIN_REPLICAS),
                             dead_lettered:{reason}, regex_timeouts (pages whose rule regexes
                             ran out of RULES_REGEX_TIMEOUT_S), extractor_timeouts and
                             extractor_crashes (EXTRACTOR calls stopped or crashed).
    content:{url}            STRING, the response cache: a zlib stream (ISA-L deflate level 0)
                             of a JSON header line and the body of a 200 response, PX
                             CACHE_TTL_S.
    ratelimit:{domain}       ZSET, sliding log of permits (score = Redis ms clock), PX window.
    ratelimit:{domain}:next  STRING, the domain's next bookable slot (ms), PX.
    throttle:{domain}        HASH, the domain's adaptive throttle (common/web/throttle.py):
                             level, until (block end, ms), rate (fraction of the configured
                             rate), cut_at, last_bad, since (ms), status, reason; PX the block
                             left + THROTTLE_FORGIVE_S, so a quiet domain is forgiven by itself.
    throttled                ZSET of the domains with a throttle state (score: when it expires,
                             ms), for the status view; trimmed by the throttle script.
    failures:{url}           STRING counter of failed attempts, EX FAILURES_TTL_S.
    poison:{url}             HASH of a URL whose delivery ended without an outcome (its worker
                             died): deaths (redelivered arrivals), stage (the last one entered
                             by a redelivery), detail; EX FAILURES_TTL_S. POISON_DELIVERIES
                             deaths dead-letter it as ``poison`` (common/work/poison.py).
    robots:{origin}          STRING, JSON {status, body, fetched_at} of the origin's robots.txt,
                             EX ROBOTS_TTL_S (shorter for an unavailable one).
    robots:lock:{origin}     STRING, held (NX PX 30 s) by the one worker fetching robots.txt.
    workers:{id}             STRING, JSON heartbeat of a live worker (id, host, pid, started,
                             beat, interval_s, processed, outcomes, in_flight, current URLs,
                             pressure: paused/reason/health and the figures), EX 3 × the
                             heartbeat interval: a killed worker's key expires by itself;
                             renewed with EXPIRE while Redis refuses writes (OOM).
    claim:{fp}               STRING, the token of whoever is publishing this URL (fingerprint
                             hex): a crawl-mode page, or a producer (``producer:{id}``), PX
                             CLAIM_TTL_MS (2 min): pages skip the URL meanwhile; the same page,
                             redelivered after a crash, takes it over, and any producer takes
                             a producer's over. Deleted when the URL is marked seen (same
                             script) or not published.
    crawl:pages:{domain}     STRING counter of pages crawl mode enqueued for the domain
                             (budget CRAWL_MAX_PAGES_PER_DOMAIN), no expiry: DEL to reset. A
                             job run's own: crawl:pages:{name}/{run}|{domain}.
    deferred                 ZSET of deferred work messages (fairness, common/intake/defer.py):
                             member = "{domain} {queue} {ttl_ms or -}" newline the message body,
                             score = when a releaser publishes it (its turn at the domain's rate
                             minus DEFER_LEAD_S, Redis ms clock).
    deferred:inflight        ZSET, the same members claimed by a worker's releaser, score = the
                             claim's lease end (ms); removed once their publish is confirmed,
                             claimed again by any releaser once the lease ran out (kill -9).
    deferred:counts          HASH domain -> deferred URLs (both ZSETs), for the status view.
    deferred:next:{domain}   STRING, the domain's next free release slot (ms, Redis clock),
                             advanced by one spacing of its rate per URL; PX until it is past.
    schedule:due             ZSET, the recrawl schedule: member = canonical URL, score = its
                             next visit (Redis ms clock). The active scheduler moves due members
                             to schedule:inflight in the script that checks its lease.
    schedule:inflight        HASH url -> "token:due_ms:taken_ms": URLs taken by the scheduler
                             holding fencing token ``token``, not yet published and rescheduled.
                             A newer leader takes over an older token's entries a lease old.
    schedule:state           HASH url -> JSON {i: interval s, h: last content_hash, id: last
                             results id learned, v: visits learned, c: changes seen, e: last
                             ETag, m: last Last-Modified (each absent when the site sent none)}.
    schedule:lease           STRING "token:owner", SET NX PX SCHEDULE_LEASE_S by the one active
                             scheduler replica, renewed while it runs, DEL on a clean stop.
    schedule:fence           STRING counter (INCR): the fencing token of each new lease.
    status:readings          ZSET of the outcome counters each ``status`` call read (member
                             "{ms} {results entries-added} {failures entries-added}", score =
                             its Redis ms clock), kept STATUS_READINGS_KEEP_S: the rate of the
                             last minute while a sink trims the streams (common/ops/
                             crawl_progress.py). PX one hour after the last status call.
    jobs                     HASH job name -> its definition (JSON of
                             :class:`common.jobs.spec.JobSpec`), written with its state in one
                             MULTI: a job is submitted whole or not at all.
    jobs:version             STRING counter, INCR on every job definition or state change:
                             workers reload their job book when it moved (the admit script
                             returns it with a job's state, no extra round trip).
    job:{name}               HASH, the job's state: state (created, running, paused, finished,
                             cancelled), run (current run number, 0 before the first), reason
                             (why it ended), submitted, started, ended (ms), next_run (ms, a
                             scheduled job's next run), seeded (the run whose seeds are all
                             published).
    jobs:runs                HASH job name -> the last run number of a deleted job: a job
                             submitted again under that name goes on from it, so a queued
                             message of a deleted job's run can never count in a new run.
    job:{name}:seeds         LIST of the job's seed URLs (from its file's urls and files).
    job:{name}:run:{n}       HASH, run n's counters: known (URLs accepted by its dedupe),
                             results, failed, failed:{reason}, cancelled, expired, paused,
                             bytes; started, ended (ms).
    job:{name}:run:{n}:claimed  ZSET of a run's page-budget reservations (limits.pages): member =
                             a claimed URL's fingerprint member, score = the claim's end (ms);
                             removed when it is marked seen or released, PEXPIRE the claim TTL.
    job:{name}:run:{n}:readings ZSET of a run's progress readings ("{ms} {results} {outcomes}",
                             score = Redis ms), kept 600 s, PX one hour after the last reading
                             (common/jobs/progress.py): its pages/s and ETA.
    deferred:next:{name}/{run}:{domain}  STRING, a job's own next release slot for the domain
                             (its politeness.rate_limit, common/intake/defer.py), as
                             ``deferred:next:{domain}``.
    job:{name}:parked        ZSET of a paused job's work messages (member as ``deferred``'s,
                             score = when parked), moved to ``deferred`` by resume.
    jobs:webhooks            ZSET of webhook deliveries due (member JSON {job, run, url,
                             attempt}, score = when due, ms), sent by the job runner.
    jobs:lease               STRING "token:owner", the job runner's lease (one runner seeds,
                             schedules and finishes jobs), as ``schedule:lease``.
    api:tokens               HASH sha256(token) hex -> JSON {name, scope (read or admin),
                             created, expires (0: never), user (a login's)}: the control
                             plane's bearer tokens, stored hashed (common/api/auth.py).
    api:users                HASH user name -> JSON {scope, salt, hash (scrypt)}: the UI's
                             logins; a login creates a token of the user's scope.
    api:fails:{who}          STRING counter of failed logins for a user name or a client
                             address, PX API_LOGIN_BLOCK_S: at API_LOGIN_ATTEMPTS the login is
                             refused (429) until it expires.
    sessions:{job}|{site}    HASH, the session pool of a job on a site (SESSION_POOL_SIZE,
                             common/web/sessions.py): slot -> its generation (a retired
                             session's slot gets the next one, with an empty jar), and
                             ``{slot}:uses`` -> requests served; EX a day after the last use.
    cookies:{job}|{site}|{session}  HASH, one session's cookie jar (common/web/cookies.py):
                             "domain;path;name" -> JSON of the cookie (value, expiry, flags);
                             at most COOKIE_JAR_MAX_COOKIES / _BYTES; PX the latest expiry
                             (a day for session cookies). ``{session}`` is "slot.generation"
                             ("0.0" without a pool). Never logged.
    session:login:{job}|{site}|{session}  STRING, held (NX PX) by the one worker logging the
                             session in; the others park their URL meanwhile.
    proxy:rest:{id}          STRING, set PX PROXY_REST_S when the proxy failed: resting
                             fleet-wide (``{id}``: a digest of its URL, never the URL).
    proxy:stats              HASH "{id}:served" / "{id}:failed" counters, and "{id}:name" -> the
                             proxy's redacted URL, for the status view.
    render:domains           HASH "{job}|{site}" -> when (epoch s) its pages stop going straight
                             to the render queue: a domain whose plain page looked like a
                             JavaScript shell (RENDER=auto, a rule's render.when_missing), for
                             RENDER_DOMAIN_TTL_S. Read whole by each HTTP worker every few
                             seconds (common/work/render_route.py); entries past their time
                             are removed by the worker that marks the next one.

``{url}`` is the canonical URL; ``{origin}`` is scheme://host[:port]; ``{domain}`` the host;
``{site}`` a URL's rate-limit domain; ``{job}`` a job's name ("default" outside jobs).

On a Redis Cluster (common/store/slots.py, docs/design-redis-cluster.md) the keys one script
touches share a hash tag after their prefix: a domain's keys and the admit/record scripts'
per-URL keys that of the domain's shard (``ratelimit:{s3.54}:example.com``,
``done:{s3.54}:1f``); a seen bucket and its URLs' claims that of the bucket's shard; results,
failures, assets, stats:counters, throttled and sinks have one part per shard
(``results:{s3.54}``); heartbeats share ``{workers}``, the recrawl schedule's keys
``{schedule}``, deferral's ``{deferred}``. Outside cluster mode, the names above.
"""

from __future__ import annotations

from typing import Literal

from common.store.slots import bucket_shard, cluster, domain_shard, tag, url_shard

SEEN_PREFIX = "crawled_urls:"
DONE_PREFIX = "done:"
RESULTS_STREAM = "results"
FAILURES_STREAM = "failures"
ASSETS_STREAM = "assets"
SINKS = "sinks"
COUNTERS = "stats:counters"


def seen_bucket(bucket: int, prefix: str = SEEN_PREFIX, shard: int | None = None) -> str:
    """The key of bucket number ``bucket`` of a fingerprint set (seen-set by default); on a
    cluster in ``shard`` (default: the bucket's own, :func:`common.store.slots.bucket_shard`)."""
    return f"{prefix}{tag(bucket_shard(bucket) if shard is None else shard)}{bucket:x}"


def sink_group(name: str) -> str:
    """The consumer group on ``results`` through which sink ``name`` reads."""
    return f"sink:{name}"


def content_key(url: str) -> str:
    return f"content:{tag(url_shard(url))}{url}"


def rate_log_key(domain: str) -> str:
    return f"ratelimit:{tag(domain_shard(domain))}{domain}"


def rate_slot_key(domain: str) -> str:
    return f"ratelimit:{tag(domain_shard(domain))}{domain}:next"


THROTTLED = "throttled"


def throttle_key(domain: str) -> str:
    return f"throttle:{tag(domain_shard(domain))}{domain}"


def failures_key(url: str) -> str:
    return f"failures:{tag(url_shard(url))}{url}"


def poison_key(url: str) -> str:
    return f"poison:{tag(url_shard(url))}{url}"


def robots_key(origin: str) -> str:
    return f"robots:{origin}"


def robots_lock_key(origin: str) -> str:
    return f"robots:lock:{origin}"


def claim_key(fp_hex: str, bucket: int = 0) -> str:
    """A URL's claim; on a cluster in its seen bucket's shard (``bucket``)."""
    return f"claim:{tag(bucket_shard(bucket))}{fp_hex}"


def crawl_pages_key(domain: str) -> str:
    return f"crawl:pages:{domain}"


def deferred_key(name: Literal["", "inflight", "counts"] = "") -> str:
    """``deferred``, ``deferred:inflight``, ``deferred:counts``; on a cluster after the tag
    ``{deferred}`` (``deferred:{deferred}:inflight``): the deferral scripts touch them with the
    domains' release slots (:func:`deferred_next_key`), so all of them share one slot."""
    whole = "deferred:{deferred}" if cluster() else "deferred"
    return f"{whole}:{name}" if name else whole


def deferred_next_key(domain: str) -> str:
    return f"{deferred_key()}:next:{domain}"


ScheduleKey = Literal["due", "inflight", "state", "lease", "fence"]


def schedule_key(name: ScheduleKey) -> str:
    """``schedule:{name}``; on a cluster ``schedule:{schedule}:{name}``: the recrawl
    scheduler's scripts touch its keys together, so they share one slot."""
    return f"schedule:{'{schedule}:' if cluster() else ''}{name}"


WORKERS_PREFIX = "workers:"


def worker_key(worker_id: str) -> str:
    return f"{WORKERS_PREFIX}{'{workers}:' if cluster() else ''}{worker_id}"


STATUS_READINGS = "status:readings"


JOBS = "jobs"
JOBS_VERSION = "jobs:version"
JOBS_WEBHOOKS = "jobs:webhooks"
JOBS_LEASE = "jobs:lease"
JOBS_LAST_RUNS = "jobs:runs"


def job_key(name: str) -> str:
    """The state hash of job ``name``."""
    return f"job:{name}"


def job_seeds_key(name: str) -> str:
    return f"job:{name}:seeds"


def job_run_key(name: str, run: int) -> str:
    """The counters of run ``run`` of job ``name``."""
    return f"job:{name}:run:{run}"


def job_parked_key(name: str) -> str:
    return f"job:{name}:parked"


API_TOKENS = "api:tokens"
API_USERS = "api:users"


def api_fails_key(who: str) -> str:
    """Failed logins of a user name or a client address (``user:NAME``, ``addr:IP``); on a
    cluster under the tag ``{api}``: a login reads and counts two of them together."""
    return f"api:fails:{'{api}:' if cluster() else ''}{who}"


def session_pool_key(job: str, site: str) -> str:
    return f"sessions:{tag(domain_shard(site))}{job}|{site}"


def cookie_jar_key(job: str, site: str, session: str) -> str:
    return f"cookies:{tag(domain_shard(site))}{job}|{site}|{session}"


def session_login_key(job: str, site: str, session: str) -> str:
    return f"session:login:{tag(domain_shard(site))}{job}|{site}|{session}"


def proxy_rest_key(proxy_id: str) -> str:
    return f"proxy:rest:{proxy_id}"


PROXY_STATS = "proxy:stats"
RENDER_DOMAINS = "render:domains"
