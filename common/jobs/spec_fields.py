"""The sections of a job file, each checked into its part of a job (common/jobs/spec.py).

Every check raises :class:`BadJob` naming the field (``limits.duration: …``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from common.core.config import KNOBS
from common.core.errors import ConfigError, InvalidURL
from common.core.urls import canonicalize
from common.core.values import parse_duration, parse_size
from common.web.login import parse_login
from common.web.proxies import parse_proxy_urls

_KNOB = {knob.env: knob for knob in KNOBS}
MAX_SEEDS = 1_000_000
MAX_WEBHOOKS = 10


class BadJob(ConfigError):
    """A job file or definition that cannot be submitted; the message names the field."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)
        self.field = where


@dataclass(frozen=True)
class Limits:
    pages: int | None = None  # URLs the job may know (its dedupe refuses more): over_budget
    duration_s: int | None = None  # wall time from a run's start: then it stops (as cancelled)
    bytes: int | None = None  # body bytes fetched by a run: then it stops


@dataclass(frozen=True)
class Schedule:
    every_s: int | None = None
    cron: str | None = None


def _mapping(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadJob(where, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise BadJob(where, f"keys must be text, got {key!r}")
    return value


def _known(value: dict[str, Any], allowed: set[str], where: str) -> None:
    for key in value:
        if key not in allowed:
            raise BadJob(f"{where}.{key}" if where else key,
                         "unknown field (known: " + ", ".join(sorted(allowed)) + ")")


def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float | str):
        return str(value)
    raise BadJob(where, f"expected a single value, got {type(value).__name__}")


def _list(value: Any, where: str) -> list[Any]:
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list):
        raise BadJob(where, f"expected a list, got {type(value).__name__}")
    return value


def _url(value: Any, where: str, max_length: int) -> str:
    if not isinstance(value, str):
        raise BadJob(where, f"expected a URL, got {type(value).__name__}")
    try:
        return canonicalize(value, max_length=max_length)
    except InvalidURL as exc:
        raise BadJob(where, f"{value[:200]!r}: {exc}") from None


def _seeds(value: Any, base_dir: str, max_url_length: int
           ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    if value is None:
        return (), ()
    seeds = _mapping(value, "seeds")
    _known(seeds, {"urls", "files", "sitemaps"}, "seeds")
    urls = [_url(u, f"seeds.urls[{i}]", max_url_length)
            for i, u in enumerate(_list(seeds.get("urls", []), "seeds.urls"))]
    for i, path in enumerate(_list(seeds.get("files", []), "seeds.files")):
        where = f"seeds.files[{i}]"
        if not isinstance(path, str):
            raise BadJob(where, "expected a file name")
        full = os.path.join(base_dir, path)
        try:
            with open(full, encoding="utf-8") as handle:
                for number, line in enumerate(handle, 1):
                    line = line.strip()
                    if line and not line.startswith("#"):
                        urls.append(_url(line, f"{where} line {number}", max_url_length))
                        if len(urls) > MAX_SEEDS:
                            raise BadJob("seeds", f"more than {MAX_SEEDS} seed URLs: use a "
                                         "sitemap or seed the rest with `scrape-fleet seed "
                                         "--job`")
        except OSError as exc:
            raise BadJob(where, f"cannot read {full!r}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise BadJob(where, f"{full!r} is not UTF-8 text") from None
    sitemaps = [_url(u, f"seeds.sitemaps[{i}]", max_url_length)
                for i, u in enumerate(_list(seeds.get("sitemaps", []), "seeds.sitemaps"))]
    return tuple(dict.fromkeys(urls)), tuple(dict.fromkeys(sitemaps))


def _crawl(value: Any, knobs: dict[str, str]) -> None:
    if value is None:
        return
    if value is False:
        knobs["CRAWL_ENABLED"] = "false"
        return
    crawl = {} if value is True else _mapping(value, "crawl")
    _known(crawl, {"max_depth", "allowed_domains", "max_pages_per_domain", "nofollow"},
           "crawl")
    knobs["CRAWL_ENABLED"] = "true"
    for key, env in (("max_depth", "CRAWL_MAX_DEPTH"),
                     ("max_pages_per_domain", "CRAWL_MAX_PAGES_PER_DOMAIN"),
                     ("nofollow", "CRAWL_NOFOLLOW")):
        if key in crawl:
            knobs[env] = _scalar_text(crawl[key], f"crawl.{key}")
    if "allowed_domains" in crawl:
        domains = _list(crawl["allowed_domains"], "crawl.allowed_domains")
        if not all(isinstance(d, str) and d.strip() for d in domains):
            raise BadJob("crawl.allowed_domains", "expected host names")
        knobs["CRAWL_ALLOWED_DOMAINS"] = ",".join(d.strip() for d in domains)


def read_yaml(path: str, where: str) -> Any:
    """A YAML (or JSON) file's content. Raises BadJob naming ``where`` and the path."""
    import yaml  # local: only a job file is YAML (not a plain worker's concern)

    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.safe_load(handle)
    except OSError as exc:
        raise BadJob(where, f"cannot read {path!r}: {exc.strerror or exc}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise BadJob(where, f"{path!r} is not YAML: {exc}") from None


def _rules(value: Any, base_dir: str) -> str:
    """The rules as inline JSON (what EXTRACT_RULES takes), a file read now."""
    if isinstance(value, str):
        value = read_yaml(os.path.join(base_dir, value.removeprefix("@")), "rules")
    if not isinstance(value, dict | list):
        raise BadJob("rules", "expected rules (a mapping or a list) or a rules file name")
    # The rules themselves are validated with the workers' own validator before the job is
    # stored (common/work/job_check.py): this room sits below the worker's.
    return json.dumps(value, ensure_ascii=False)


def _politeness(value: Any, knobs: dict[str, str]) -> tuple[int, int] | None:
    if value is None:
        return None
    politeness = _mapping(value, "politeness")
    _known(politeness, {"rate_limit", "robots"}, "politeness")
    if "robots" in politeness:
        knobs["ROBOTS_ENABLED"] = _scalar_text(politeness["robots"], "politeness.robots")
    if "rate_limit" not in politeness:
        return None
    raw = _scalar_text(politeness["rate_limit"], "politeness.rate_limit")
    try:
        return _KNOB["RATE_LIMIT"].parse(raw)
    except ValueError as exc:
        raise BadJob("politeness.rate_limit", f"{raw!r}: {exc} (e.g. 2/second)") from None


def _limits(value: Any, knobs: dict[str, str]) -> Limits:
    if value is None:
        return Limits()
    limits = _mapping(value, "limits")
    _known(limits, {"pages", "depth", "duration", "bytes"}, "limits")
    pages = limits.get("pages")
    if pages is not None and (type(pages) is not int or pages < 1):
        raise BadJob("limits.pages", "expected a whole number of pages, at least 1")
    if "depth" in limits:
        depth = _scalar_text(limits["depth"], "limits.depth")
        if knobs.get("CRAWL_MAX_DEPTH", depth) != depth:
            raise BadJob("limits.depth", "differs from crawl.max_depth: keep one")
        knobs["CRAWL_MAX_DEPTH"] = depth
    try:
        duration = (parse_duration(_scalar_text(limits["duration"], "limits.duration"))
                    if "duration" in limits else None)
    except ValueError as exc:
        raise BadJob("limits.duration", str(exc)) from None
    try:
        size = parse_size(_scalar_text(limits["bytes"], "limits.bytes")) \
            if "bytes" in limits else None
    except ValueError as exc:
        raise BadJob("limits.bytes", str(exc)) from None
    return Limits(pages=pages, duration_s=duration, bytes=size)


def _schedule(value: Any) -> Schedule | None:
    if value is None:
        return None
    schedule = _mapping(value, "schedule")
    _known(schedule, {"every", "cron"}, "schedule")
    if ("every" in schedule) == ("cron" in schedule):
        raise BadJob("schedule", "give exactly one of every (a duration) or cron")
    if "every" in schedule:
        try:
            return Schedule(every_s=parse_duration(
                _scalar_text(schedule["every"], "schedule.every")))
        except ValueError as exc:
            raise BadJob("schedule.every", str(exc)) from None
    cron = schedule["cron"]
    if not isinstance(cron, str):
        raise BadJob("schedule.cron", "expected a cron expression such as '0 3 * * *'")
    from common.jobs.cron import check_cron  # croniter: only jobs with a cron need it

    try:
        check_cron(cron)
    except ValueError as exc:
        raise BadJob("schedule.cron", str(exc)) from None
    return Schedule(cron=cron)


def _webhooks(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    hooks = _list(value, "webhooks")
    if len(hooks) > MAX_WEBHOOKS:
        raise BadJob("webhooks", f"at most {MAX_WEBHOOKS}")
    out = []
    for i, hook in enumerate(hooks):
        url = _url(hook, f"webhooks[{i}]", 2048)
        if not url.startswith(("http://", "https://")):
            raise BadJob(f"webhooks[{i}]", "expected an http or https URL")
        out.append(url)
    return tuple(out)


#: ``session:`` key -> the setting it sets (docs/real-web.md).
SESSION_FIELDS = {"cookies": "COOKIES_ENABLED", "pool": "SESSION_POOL_SIZE",
                  "retire_statuses": "SESSION_RETIRE_STATUSES",
                  "max_retires": "SESSION_MAX_RETIRES", "max_uses": "SESSION_MAX_USES",
                  "login": "SESSION_LOGIN"}


def _session(value: Any, knobs: dict[str, str]) -> None:
    """``session: {cookies, pool, retire_statuses, max_retires, max_uses, login}``."""
    if value is None:
        return
    session = _mapping(value, "session")
    _known(session, set(SESSION_FIELDS), "session")
    for key, env in SESSION_FIELDS.items():
        if key not in session:
            continue
        raw, where = session[key], f"session.{key}"
        if key == "retire_statuses":
            knobs[env] = ",".join(_scalar_text(s, where) for s in _list(raw, where))
        elif key == "login":
            if raw is not None and not isinstance(raw, dict | str):
                raise BadJob(where, "expected a mapping (url, fields, form, success)")
            knobs[env] = json.dumps(raw, ensure_ascii=False) if isinstance(raw, dict) else \
                (raw or "")
        else:
            knobs[env] = _scalar_text(raw, where)


def _proxies(value: Any, knobs: dict[str, str]) -> None:
    """``proxies: {urls: [...], rotation: request|session}``; ``false``: direct."""
    if value is None:
        return
    if value is False:
        knobs["PROXY_URLS"] = ""
        return
    proxies = _mapping(value, "proxies")
    _known(proxies, {"urls", "rotation"}, "proxies")
    if "urls" in proxies:
        urls = _list(proxies["urls"], "proxies.urls")
        if not all(isinstance(u, str) for u in urls):
            raise BadJob("proxies.urls", "expected proxy URLs")
        knobs["PROXY_URLS"] = ",".join(u.strip() for u in urls)
    if "rotation" in proxies:
        knobs["PROXY_ROTATION"] = _scalar_text(proxies["rotation"], "proxies.rotation")


def check_identity(knobs: dict[str, str], where_of: dict[str, str]) -> None:
    """Proxy URLs and a login checked as the workers will read them: errors show a proxy
    redacted and never a login's value; a login's ``{env}``/``{file}`` are read by the
    workers, not here (the machine submitting may not hold the secrets)."""
    if knobs.get("PROXY_URLS"):
        try:
            parse_proxy_urls(knobs["PROXY_URLS"])
        except ValueError as exc:
            raise BadJob(where_of.get("PROXY_URLS", "settings.PROXY_URLS"), str(exc)) from None
    if knobs.get("SESSION_LOGIN"):
        try:
            parse_login(knobs["SESSION_LOGIN"], resolve=False)
        except (ConfigError, ValueError) as exc:
            raise BadJob(where_of.get("SESSION_LOGIN", "settings.SESSION_LOGIN"),
                         str(exc)) from None
