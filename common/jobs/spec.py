"""A job file: what one crawl is, validated whole before anything is stored.

    name: shop                        # [a-z0-9][a-z0-9_-]*, at most 63; "default" is reserved
    seeds:
      urls: [https://shop.example/]   # and/or
      files: [seeds.txt]              # one URL a line, read at submission (next to the file)
      sitemaps: [https://shop.example/sitemap.xml]
    crawl:                            # crawl mode for this job's pages (off when absent)
      max_depth: 2
      allowed_domains: [shop.example]
      max_pages_per_domain: 5000
      nofollow: true
    rules: rules.yml                  # extraction rules: a file next to this one, or inline
    handlers: shop.handlers:router    # a router the workers were started with (HANDLERS)
    politeness:
      rate_limit: 2/second            # this job's pace per domain (the fleet's stays the ceiling)
      robots: true
    priority: high                    # normal (default) or high: the priority queue
    limits: {pages: 10000, depth: 3, duration: 2h, bytes: 1GiB}
    schedule: {every: 6h}             # or {cron: "0 3 * * *"}: numbered runs
    webhooks: [https://hooks.example/crawl-done]
    session:                          # cookies and sessions (docs/real-web.md)
      cookies: true                   # COOKIES_ENABLED (default true)
      pool: 3                         # SESSION_POOL_SIZE
      retire_statuses: [403, 429]     # SESSION_RETIRE_STATUSES
      max_retires: 3                  # SESSION_MAX_RETIRES
      max_uses: 200                   # SESSION_MAX_USES
      login: {url: https://shop.example/login, fields: {user: me, password: {env: SHOP_PW}}}
    proxies: {urls: [http://proxy.example:3128], rotation: session}   # or false: direct
    render: auto                      # RENDER: off, auto or always (true/false: always/off)
    media: {types: [image/*], quota: 2GB, prefix: shop/}   # its assets (docs/media.md)
    settings: {MAX_RECORD_BYTES: "131072"}   # other per-job settings (JOB_KNOBS)

:func:`parse_job` turns the mapping into a :class:`JobSpec` or raises :class:`BadJob` naming
the field (``crawl.max_depth: must be a non-negative integer``): nothing is half-submitted,
because nothing is stored before the whole file is valid. Files (rules, seed lists) are read
at submission and stored with the job, so workers need neither the files nor a restart.

A job's page settings are the fleet's :class:`~common.core.config.Settings` with the job's
values over them (:meth:`JobSpec.settings_for`): each structured field names an existing
setting (``crawl.max_depth`` is CRAWL_MAX_DEPTH), parsed by that setting's own parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.core.config import KNOBS, Settings
from common.core.redact import redact_url
from common.jobs.spec_fields import (
    SESSION_FIELDS,
    BadJob,
    Limits,
    Schedule,
    _crawl,
    _known,
    _limits,
    _mapping,
    _politeness,
    _proxies,
    _rules,
    _scalar_text,
    _schedule,
    _seeds,
    _session,
    _webhooks,
    check_identity,
    read_yaml,
)

#: What a job may set: the settings read per page (extraction, user code, crawl mode, record
#: bounds, robots.txt). Connection, fleet-wide politeness and process settings stay the fleet's.
JOB_KNOBS = frozenset({
    "EXTRACT_RULES", "HANDLERS", "CRAWL_ENABLED", "CRAWL_MAX_DEPTH", "CRAWL_ALLOWED_DOMAINS",
    "CRAWL_MAX_PAGES_PER_DOMAIN", "CRAWL_NOFOLLOW", "ROBOTS_ENABLED", "MAX_RECORD_BYTES",
    "RECORD_MAX_LINKS", "RULES_REGEX_TIMEOUT_S", "HANDLER_TIMEOUT_S", "MAX_WAIT_S",
    "COOKIES_ENABLED", "SESSION_POOL_SIZE", "SESSION_RETIRE_STATUSES", "SESSION_MAX_RETIRES",
    "SESSION_MAX_USES", "SESSION_LOGIN", "PROXY_URLS", "PROXY_ROTATION", "RENDER",
    "MEDIA_TYPES", "MEDIA_MAX_BYTES", "MEDIA_QUOTA_BYTES", "MEDIA_PREFIX",
})
#: Knobs whose values ``job show`` must not print as stored (credentials in proxy URLs).
SECRET_KNOBS = frozenset({"PROXY_URLS"})
_KNOB = {knob.env: knob for knob in KNOBS}

NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")
DEFAULT_JOB = "default"
PRIORITIES = ("normal", "high")
_TOP = {"name", "seeds", "crawl", "rules", "handlers", "politeness", "priority", "limits",
        "schedule", "webhooks", "settings", "description", "session", "proxies", "render",
        "media"}
#: A job's ``media`` keys and the settings they set (docs/media.md).
MEDIA_FIELDS = {"types": "MEDIA_TYPES", "max_bytes": "MEDIA_MAX_BYTES",
                "quota": "MEDIA_QUOTA_BYTES", "prefix": "MEDIA_PREFIX"}


@dataclass(frozen=True)
class JobSpec:
    """One job's definition: everything a job file said, validated, files already read."""

    name: str
    seed_urls: tuple[str, ...] = ()
    sitemaps: tuple[str, ...] = ()
    knobs: Mapping[str, str] = field(default_factory=dict)  # ENV -> raw text, JOB_KNOBS only
    rate_limit: tuple[int, int] | None = None  # (amount, window ms): the job's own pace
    priority: str = "normal"
    limits: Limits = Limits()
    schedule: Schedule | None = None
    webhooks: tuple[str, ...] = ()
    description: str = ""

    def settings_for(self, base: Settings) -> Settings:
        """The fleet's settings with this job's per-page values over them."""
        return dataclasses.replace(base, **self.overrides()) if self.knobs else base

    def shown_knobs(self) -> dict[str, str]:
        """The knobs as ``job show`` may print them: proxy credentials redacted."""
        return {env: ",".join(redact_url(u.strip()) for u in raw.split(","))
                if env in SECRET_KNOBS and raw else raw for env, raw in self.knobs.items()}

    def shown(self) -> dict[str, Any]:
        """The stored definition as ``job show --json`` and the API may show it: webhook URLs
        (a hook's secret: ?token=…) and proxy credentials redacted."""
        body = json.loads(self.to_json())
        body["webhooks"] = [redact_url(url) for url in body["webhooks"]]
        body["knobs"] = self.shown_knobs()
        return body

    def overrides(self) -> dict[str, Any]:
        """Settings attribute -> parsed value, for each knob the job sets."""
        return {_KNOB[env].attr: _KNOB[env].parse(raw) for env, raw in self.knobs.items()}

    @property
    def handlers(self) -> str:
        return self.knobs.get("HANDLERS", "")

    def to_json(self) -> str:
        """The stored form (seed URLs are stored apart: ``job:{name}:seeds``)."""
        body = dataclasses.asdict(self)
        del body["seed_urls"]
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes, seed_urls: tuple[str, ...] = ()) -> JobSpec:
        body = json.loads(text)
        schedule = body.pop("schedule")
        rate = body.pop("rate_limit")
        return cls(seed_urls=seed_urls, limits=Limits(**body.pop("limits")),
                   schedule=Schedule(**schedule) if schedule else None,
                   rate_limit=tuple(rate) if rate else None,
                   sitemaps=tuple(body.pop("sitemaps")), webhooks=tuple(body.pop("webhooks")),
                   **body)


def load_job_file(path: str) -> JobSpec:
    """Read and validate a job file (YAML or JSON); ``-``: from standard input (files it
    names are then read from the current directory: a container's, under compose).

    Raises:
        BadJob: the file cannot be read, is not a mapping, or a field is wrong (named).
    """
    if path == "-":
        import yaml  # local: only a job file is YAML (not a plain worker's concern)

        try:
            return parse_job(yaml.safe_load(sys.stdin), base_dir=os.getcwd())
        except yaml.YAMLError as exc:
            raise BadJob("", f"the job file on standard input is not YAML: {exc}") from None
    return parse_job(read_yaml(path, ""), base_dir=os.path.dirname(os.path.abspath(path)))


def parse_job(data: Any, *, base_dir: str = ".", max_url_length: int = 2048) -> JobSpec:
    """A job definition (a job file's mapping) as a :class:`JobSpec`.

    Raises:
        BadJob: naming the first wrong field.
    """
    top = _mapping(data, "")
    _known(top, _TOP, "")
    name = top.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise BadJob("name", "required: lowercase letters, digits, - and _, at most 63, "
                     "starting with a letter or digit")
    if name == DEFAULT_JOB:
        raise BadJob("name", f"{DEFAULT_JOB!r} is the fleet's own job (commands without a job)")
    knobs: dict[str, str] = {}
    seeds, sitemaps = _seeds(top.get("seeds"), base_dir, max_url_length)
    _crawl(top.get("crawl"), knobs)
    if "rules" in top:
        knobs["EXTRACT_RULES"] = _rules(top["rules"], base_dir)
    if "handlers" in top:
        ref = top["handlers"]
        if not isinstance(ref, str) or ":" not in ref:
            raise BadJob("handlers", "expected package.module:router")
        knobs["HANDLERS"] = ref
    rate = _politeness(top.get("politeness"), knobs)
    limits = _limits(top.get("limits"), knobs)
    _session(top.get("session"), knobs)
    _proxies(top.get("proxies"), knobs)
    if "render" in top:
        render = top["render"]
        knobs["RENDER"] = (("always" if render else "off") if isinstance(render, bool)
                           else _scalar_text(render, "render"))
    for key, value in _mapping(top.get("media") or {}, "media").items():
        if key not in MEDIA_FIELDS:
            raise BadJob(f"media.{key}", f"unknown: one of {', '.join(MEDIA_FIELDS)}")
        knobs[MEDIA_FIELDS[key]] = (  # a list of types; caps as {type: size}
            ",".join(map(str, value)) if isinstance(value, list) else ",".join(
                f"{k}={v}" for k, v in value.items()) if isinstance(value, dict)
            else _scalar_text(value, f"media.{key}"))
    priority = top.get("priority", "normal")
    if priority not in PRIORITIES:
        raise BadJob("priority", f"expected one of {', '.join(PRIORITIES)}, got {priority!r}")
    given = _mapping(top.get("settings") or {}, "settings")
    for env, raw in given.items():
        if env not in JOB_KNOBS:
            raise BadJob(f"settings.{env}", "not a per-job setting (one of: "
                         + ", ".join(sorted(JOB_KNOBS)) + ")")
        if env in knobs:
            raise BadJob(f"settings.{env}", "already set by a field of the job file")
        knobs[env] = _scalar_text(raw, f"settings.{env}")
    for env, raw in knobs.items():  # each through its setting's own parser
        try:
            _KNOB[env].parse(raw)
        except ValueError as exc:
            raise BadJob(_where(env, given), str(exc)) from None
    check_identity(knobs, {env: _where(env, given) for env in ("PROXY_URLS", "SESSION_LOGIN")})
    if not (seeds or sitemaps):
        raise BadJob("seeds", "a job needs at least one seed URL, file or sitemap")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise BadJob("description", "expected text")
    return JobSpec(name=name, seed_urls=seeds, sitemaps=sitemaps, knobs=knobs, rate_limit=rate,
                   priority=priority, limits=limits, schedule=_schedule(top.get("schedule")),
                   webhooks=_webhooks(top.get("webhooks")), description=description)


_FIELD_OF = {"CRAWL_ENABLED": "crawl", "CRAWL_MAX_DEPTH": "crawl.max_depth",
             "CRAWL_ALLOWED_DOMAINS": "crawl.allowed_domains",
             "CRAWL_MAX_PAGES_PER_DOMAIN": "crawl.max_pages_per_domain",
             "CRAWL_NOFOLLOW": "crawl.nofollow", "EXTRACT_RULES": "rules",
             "HANDLERS": "handlers", "ROBOTS_ENABLED": "politeness.robots",
             **{env: f"session.{key}" for key, env in SESSION_FIELDS.items()},
             "PROXY_URLS": "proxies.urls", "PROXY_ROTATION": "proxies.rotation",
             "RENDER": "render", **{env: f"media.{key}" for key, env in MEDIA_FIELDS.items()}}


def _where(env: str, given: Mapping[str, Any]) -> str:
    """The job file's field that set ``env``: ``settings.ENV`` when given there."""
    return f"settings.{env}" if env in given else _FIELD_OF.get(env, f"settings.{env}")


