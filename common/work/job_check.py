"""A job checked against the fleet before it is stored: what the job file alone cannot tell.

:func:`common.jobs.spec.parse_job` checks the file's form; :func:`check_job`, at submission,
checks what the workers will do with it, so a job is refused then rather than dead-lettering
every page later:

* its extraction rules compile as the workers compile them (``rules: ...``);
* its ``handlers`` router is one every live worker was started with (their heartbeats'
  ``handlers``: the HANDLERS routers, common/work/heartbeat.py); with no live worker saying
  which, it must at least import here and be a ``scrape_fleet.Router``;
* its webhooks post only to JOB_WEBHOOK_HOSTS (a host or its subdomains).
"""

from __future__ import annotations

from urllib.parse import urlsplit

import redis

from common.core.config import Settings
from common.core.errors import ConfigError
from common.core.urls import canonical_host, setting_host
from common.jobs.spec import JobSpec
from common.store.workers import alive_workers
from common.work.rules_file import load_rules
from common.work.user_code import load_router
from common.work.user_extractor import handler_refs


def check_job(spec: JobSpec, client: redis.Redis, settings: Settings) -> list[str]:
    """What stops ``spec`` from running on this fleet, one line a problem (none: it may be
    stored). ``client``: the fleet's Redis (the workers' heartbeats)."""
    problems: list[str] = []
    rules = spec.knobs.get("EXTRACT_RULES", "")
    if rules.strip():
        try:
            load_rules(rules, warn=lambda _message: None)  # warnings: the workers log them
        except ConfigError as exc:
            problems.append(f"rules: {exc}")
    if spec.handlers:
        problems += _handler_problems(spec.handlers, client)
    problems += webhook_problems(spec.webhooks, settings.job_webhook_hosts)
    return problems


def _handler_problems(ref: str, client: redis.Redis) -> list[str]:
    if len(handler_refs(ref)) != 1:
        return [f"handlers: one package.module:router, got {ref!r}"]
    ref = ref.strip()
    workers = [w for w in alive_workers(client) if isinstance(w.get("handlers"), list)]
    if workers:
        lacking = [str(w.get("id")) for w in workers if ref not in w["handlers"]]
        return [f"handlers: {ref!r} is not among the HANDLERS of worker(s) "
                f"{', '.join(lacking)}; start them with it"] if lacking else []
    try:  # no live worker says which routers it has: the router must at least load here
        load_router(ref)
    except ConfigError as exc:
        return [f"handlers: {exc}"]
    return []


def webhook_problems(webhooks: tuple[str, ...], allowed_hosts: str) -> list[str]:
    """One line per webhook whose host is not in JOB_WEBHOOK_HOSTS (nor a subdomain of one)."""
    allowed = []
    for entry in allowed_hosts.split(","):
        if entry.strip():
            try:
                allowed.append(setting_host(entry))
            except ValueError:
                continue  # a malformed entry allows nothing
    problems = []
    for i, hook in enumerate(webhooks):
        host = canonical_host((urlsplit(hook).hostname or "").lower())
        if not any(host == d or host.endswith("." + d) for d in allowed):
            problems.append(f"webhooks[{i}]: host {host!r} not in JOB_WEBHOOK_HOSTS")
    return problems
