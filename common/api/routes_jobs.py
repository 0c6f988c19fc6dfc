"""Jobs over HTTP: submit, list, show, update, pause, resume, cancel, delete, runs, progress.

What ``scrape-fleet job`` does (common/ops/cli_job.py), as REST resources under ``/api/jobs``:
a definition is validated whole before anything is stored (:func:`parse_job`, then
:func:`check_job`), each problem answered 422 with its field as ``loc`` (``["body", "crawl",
"max_depth"]``). A job sent over HTTP may not name files (``seeds.files``, a rules file name):
the API never reads the server's filesystem for a caller. Unknown job: 404; a lifecycle command
the job's state does not allow: 409 with the registry's message. The progress stream and the
results are in routes_jobs_stream.py and routes_jobs_results.py.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, FastAPI, HTTPException, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from common.api.deps import Admin, Reader, redis_of, settings_of
from common.jobs.progress import RunProgress, measure
from common.jobs.registry import JobRef, JobRegistry, JobState, JobStateError
from common.jobs.spec import BadJob, JobSpec, parse_job
from common.ops.cli_job import job_domains
from common.ops.cli_job_view import schedule_text
from common.store import slots
from common.store.keys import job_seeds_key
from common.work.job_check import check_job

router = APIRouter(prefix="/api/jobs", tags=["jobs"])

_ANY = dict[str, Any]


class Seeds(BaseModel):
    """Where a job starts (at least one seed URL or sitemap)."""

    model_config = ConfigDict(extra="forbid", strict=True)
    urls: list[str] | str | None = Field(None, description="seed URLs")
    sitemaps: list[str] | str | None = Field(None, description="sitemap URLs")
    files: Any = Field(None, description="refused over HTTP (422): send the URLs in `urls`")


class JobDefinition(BaseModel):
    """A job definition: the mapping a job file holds (docs/jobs.md), as JSON. Every field is
    checked as ``scrape-fleet job submit`` checks a file; no field may name a file."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [{
        "name": "shop", "seeds": {"urls": ["https://shop.example/"]},
        "crawl": {"max_depth": 2, "allowed_domains": ["shop.example"]},
        "rules": [{"name": "product", "path": "^/p/", "fields": {"title": "h1"}}],
        "politeness": {"rate_limit": "2/second"}, "priority": "normal",
        "limits": {"pages": 10000, "duration": "2h"}}]})
    name: str = Field(description="[a-z0-9][a-z0-9_-]*, at most 63; not 'default'")
    description: str | None = None
    seeds: Seeds | None = None
    crawl: bool | _ANY | None = Field(None, description="crawl mode: max_depth, "
                                      "allowed_domains, max_pages_per_domain, nofollow")
    rules: _ANY | list[Any] | str | None = Field(
        None, description="extraction rules, inline (a rules file name is refused: 422)")
    handlers: str | None = Field(None, description="package.module:router the workers have")
    politeness: _ANY | None = Field(None, description="rate_limit (e.g. 2/second), robots")
    priority: str | None = Field(None, description="normal (default) or high")
    limits: _ANY | None = Field(None, description="pages, depth, duration, bytes")
    schedule: _ANY | None = Field(None, description="{every: 6h} or {cron: '0 3 * * *'}")
    webhooks: list[str] | str | None = Field(None, description="URLs told when a run ends")
    session: _ANY | None = Field(None, description="cookies, pool, retire_statuses, "
                                 "max_retires, max_uses, login (docs/real-web.md)")
    proxies: _ANY | None = Field(None, description="urls, rotation (request or session)")
    settings: _ANY | None = Field(None, description="other per-job settings (JOB_KNOBS)")


class CancelBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reason: str = Field("cancelled by a user", min_length=1, max_length=300)


class StateAnswer(BaseModel):
    """What a lifecycle command left: the job's new state."""

    name: str
    state: str


class JobListItem(BaseModel):
    name: str
    state: str
    run: int
    priority: str | None
    schedule: str = Field(description="'-', 'every 6h' or 'cron …'")
    progress: RunProgress


class Domain(BaseModel):
    domain: str
    throttle: str | None = Field(description="the fleet's throttle there (shared by all jobs)")
    deferred: int


class JobDetail(BaseModel):
    state: JobState
    definition: _ANY | None = Field(description="the stored definition (JobSpec as JSON)")
    seeds: int = Field(description="seed URLs stored with the job")
    schedule: str
    progress: RunProgress = Field(description="the current run's (zeros before the first)")
    domains: list[Domain]


class RunCounters(BaseModel):
    run: int
    known: int = 0
    results: int = 0
    failed: int = 0
    failed_by_reason: dict[str, int] = {}
    cancelled: int = 0
    expired: int = 0
    paused: int = 0
    bytes: int = 0
    started: int = 0
    ended: int = 0


def registry_of(request: Request) -> JobRegistry:
    """The job registry; 409 on a Redis Cluster, where jobs do not run yet."""
    if slots.cluster():
        raise HTTPException(409, f"{slots.NO_JOBS_ON_CLUSTER}: only the default crawl does")
    return JobRegistry(redis_of(request))


def state_or_404(registry: JobRegistry, name: str) -> JobState:
    """The job's state; 404 for a job that does not exist."""
    try:
        return registry.state(name)
    except JobStateError:
        raise HTTPException(404, f"no job named {name!r}") from None


def loc(field: str) -> list[str | int]:
    """A BadJob's field as a FastAPI ``loc``: ``seeds.urls[2]`` -> body, seeds, urls, 2."""
    parts = re.findall(r"\[(\d+)\]|([^.\[\]]+)", field)
    return ["body", *(int(index) if index else name.strip() for index, name in parts)]


def _unprocessable(problems: list[tuple[str, str]]) -> HTTPException:
    return HTTPException(422, [{"loc": loc(field), "msg": msg, "type": "job"}
                               for field, msg in problems])


def validated(request: Request, body: JobDefinition) -> JobSpec:
    """The definition as a JobSpec, checked against the fleet; 422 naming the field(s)."""
    data = body.model_dump(exclude_unset=True)
    refused = []
    if isinstance(data.get("seeds"), dict) and data["seeds"].get("files") is not None:
        refused.append(("seeds.files", "seeds.files: files are not read over HTTP; send the "
                        "URLs in seeds.urls"))
    if isinstance(data.get("rules"), str):
        refused.append(("rules", "rules: a rules file name is not read over HTTP; send the "
                        "rules inline (a mapping or a list)"))
    if refused:
        raise _unprocessable(refused)
    if isinstance(data.get("seeds"), dict):
        data["seeds"] = {k: v for k, v in data["seeds"].items() if v is not None}
    try:
        spec = parse_job(data, base_dir="/nonexistent")  # no file is named: none is read
    except BadJob as exc:
        raise _unprocessable([(exc.field, str(exc))]) from None
    problems = check_job(spec, redis_of(request), settings_of(request))
    if problems:
        raise _unprocessable([(p.split(":", 1)[0] if ": " in p else "", p) for p in problems])
    return spec


def _stored(registry: JobRegistry, spec: JobSpec, replace: bool) -> JobState:
    try:
        return registry.submit(spec, replace=replace)
    except JobStateError as exc:
        raise HTTPException(409, str(exc)) from None


@router.post("", status_code=201, response_model=JobState,
             responses={409: {"description": "the name is taken (or that job is active)"},
                        422: {"description": "a field is wrong (named in loc)"}})
def submit_job(request: Request, caller: Admin, body: JobDefinition,
               replace: bool = Query(False, description="replace a job of that name that is "
                                     "not running or paused")) -> JobState:
    """Validate a job definition whole and store it (created): the job runner starts it."""
    return _stored(registry_of(request), validated(request, body), replace)


@router.get("", response_model=list[JobListItem])
def list_jobs(request: Request, caller: Reader) -> list[JobListItem]:
    """Every job with its current run's progress (the rate once a reading a second old is
    stored: the progress stream stores one each tick)."""
    registry = registry_of(request)
    specs = registry.specs()
    items = []
    for progress in measure(registry.client, registry.states()):
        spec = specs.get(progress.name)
        items.append(JobListItem(name=progress.name, state=progress.state, run=progress.run,
                                 priority=spec.priority if spec else None,
                                 schedule=schedule_text(spec), progress=progress))
    return items


@router.get("/{name}", response_model=JobDetail, responses={404: {"description": "no job"}})
def show_job(request: Request, caller: Reader, name: str) -> JobDetail:
    """A job's stored definition (webhook URLs redacted), state, current run's progress
    (failures by reason) and the fleet's state at the domains of its seeds."""
    registry = registry_of(request)
    state = state_or_404(registry, name)
    spec = registry.spec(name)
    [progress] = measure(registry.client, [state])
    definition = spec.shown() if spec else None  # webhook and proxy secrets redacted
    return JobDetail(state=state, definition=definition,
                     seeds=registry.client.llen(job_seeds_key(name)),
                     schedule=schedule_text(spec), progress=progress,
                     domains=job_domains(settings_of(request), registry.client, name))


@router.put("/{name}", response_model=JobState,
            responses={404: {"description": "no job"},
                       409: {"description": "the job is running or paused"}})
def update_job(request: Request, caller: Admin, name: str, body: JobDefinition) -> JobState:
    """Replace a job that is not running or paused with a new definition (same name)."""
    if body.name != name:
        raise _unprocessable([("name", f"name: {body.name!r} differs from the path's "
                               f"{name!r}")])
    registry = registry_of(request)
    state_or_404(registry, name)
    return _stored(registry, validated(request, body), True)


def _move(request: Request, name: str, action: str, *args: str) -> StateAnswer:
    registry = registry_of(request)
    state_or_404(registry, name)
    try:
        to = getattr(registry, action)(name, *args)
    except JobStateError as exc:
        raise HTTPException(409, str(exc)) from None
    return StateAnswer(name=name, state=to)


_MOVES = {404: {"description": "no job"}, 409: {"description": "the state does not allow it"}}


@router.post("/{name}/pause", response_model=StateAnswer, responses=_MOVES)
def pause_job(request: Request, caller: Admin, name: str) -> StateAnswer:
    """running -> paused: pages in flight finish, the next ones are parked until resume."""
    return _move(request, name, "pause")


@router.post("/{name}/resume", response_model=StateAnswer, responses=_MOVES)
def resume_job(request: Request, caller: Admin, name: str) -> StateAnswer:
    """paused -> running: the parked pages go back to the workers."""
    return _move(request, name, "resume")


@router.post("/{name}/cancel", response_model=StateAnswer, responses=_MOVES)
def cancel_job(request: Request, caller: Admin, name: str,
               body: CancelBody | None = None) -> StateAnswer:
    """Stop the job for good: its queued pages are dropped as the workers meet them."""
    return _move(request, name, "cancel", (body or CancelBody()).reason)


@router.delete("/{name}", status_code=204, response_class=Response, responses=_MOVES)
def delete_job(request: Request, caller: Admin, name: str) -> Response:
    """Forget a job that is not running or paused (its results stay)."""
    registry = registry_of(request)
    state_or_404(registry, name)
    try:
        registry.delete(name)
    except JobStateError as exc:
        raise HTTPException(409, str(exc)) from None
    return Response(status_code=204)


@router.get("/{name}/runs", response_model=list[RunCounters],
            responses={404: {"description": "no job"}})
def job_runs(request: Request, caller: Reader, name: str) -> list[RunCounters]:
    """Each run's counters, start and end (ms)."""
    registry = registry_of(request)
    state = state_or_404(registry, name)
    out = []
    for run in range(1, state.run + 1):
        counters = registry.counters(JobRef(name, run))
        reasons = {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("failed:")}
        known = {k: v for k, v in counters.items() if k in RunCounters.model_fields}
        out.append(RunCounters(**{**known, "run": run}, failed_by_reason=reasons))
    return out


@router.get("/{name}/progress", response_model=RunProgress,
            responses={404: {"description": "no job"}})
def job_progress(request: Request, caller: Reader, name: str) -> RunProgress:
    """The current run's progress: known, done, failed by reason, pages/s, ETA."""
    registry = registry_of(request)
    [progress] = measure(registry.client, [state_or_404(registry, name)])
    return progress


def include(app: FastAPI) -> None:
    app.include_router(router)
