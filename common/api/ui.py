"""The web UI: server-rendered pages (Jinja2, ``common/api/templates/``) and one hand-written
script (``common/api/static/app.js``) that calls the JSON routes with the login cookie.

Pages: ``/login``, ``/`` (jobs with live progress), ``/jobs/new`` (the form, its rules editor
and the "try these rules" panel), ``/jobs/{name}`` (progress, ETA, rate chart, errors, results,
dead letters), ``/workers``. Every page but the login page needs the cookie the login sets
(common/api/deps.py COOKIE): without it, or with a refused one, the page redirects to
``/login?next=…``. The pages carry no data of their own but the job's name and the caller's
scope: the script fetches everything from the API, so what the UI shows is what the API says.

``POST /ui/yaml`` reads the rules editor's YAML (or JSON) text into JSON for the script
(no YAML parser in the browser without a library); the job and the rules are then validated
by the API routes themselves, whose 422 names the field next to which the form shows it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import yaml
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from pydantic import BaseModel, Field

from common.api.auth import AuthError, Caller
from common.api.deps import COOKIE, Admin
from common.core.config import Settings
from common.jobs.spec import NAME

HERE = Path(__file__).parent
TEMPLATES = Jinja2Templates(directory=str(HERE / "templates"))
#: Grafana as docker-compose.yml publishes it (the only place the fleet runs one).
GRAFANA_URL = "http://127.0.0.1:3000"
RABBITMQ_MANAGEMENT_PORT = 15672
#: The longest rules text the editor may send (the rules of a job are stored whole).
MAX_RULES_CHARS = 200_000


class RulesText(BaseModel):
    text: str = Field(max_length=MAX_RULES_CHARS, description="rules as YAML or JSON")


def include(app: FastAPI) -> None:
    """The pages, ``POST /ui/yaml`` and ``/static``."""
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.get("/login", include_in_schema=False)
    def login_page(request: Request, next: str = "/") -> Response:
        return _render(request, "login.html", None, next=_local(next))

    @app.get("/", include_in_schema=False)
    def jobs_page(request: Request) -> Response:
        return _page(request, "jobs.html")

    @app.get("/jobs/new", include_in_schema=False)
    def new_job_page(request: Request) -> Response:
        return _page(request, "job_new.html")

    @app.get("/jobs/{name}", include_in_schema=False)
    def job_page(request: Request, name: str) -> Response:
        if not NAME.fullmatch(name):
            raise HTTPException(404, f"no job named {name!r}")
        return _page(request, "job.html", job=name)

    @app.get("/workers", include_in_schema=False)
    def workers_page(request: Request) -> Response:
        return _page(request, "workers.html")

    @app.post("/ui/yaml", tags=["ui"])
    def read_rules_text(body: RulesText, caller: Admin) -> dict[str, Any]:
        """The rules editor's YAML (or JSON) as JSON: ``{"rules": …}``; 422 naming ``text``
        and the line when it is not YAML."""
        try:
            value = yaml.safe_load(body.text) if body.text.strip() else None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise HTTPException(422, [{"loc": ["body", "text"],
                                       "msg": f"not YAML{where}: {problem}",
                                       "type": "value_error"}]) from None
        return {"rules": value}


def _page(request: Request, template: str, **context: Any) -> Response:
    """``template`` for a logged-in caller; else a redirect to the login page."""
    try:
        caller = request.app.state.tokens.check(request.cookies.get(COOKIE))
    except AuthError:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)
    return _render(request, template, caller, **context)


def _render(request: Request, template: str, caller: Caller | None,
            **context: Any) -> HTMLResponse:
    settings: Settings = request.app.state.settings
    response = TEMPLATES.TemplateResponse(request, template, {
        "caller": caller, "rabbitmq_url": rabbitmq_ui(settings), "grafana_url": GRAFANA_URL,
        **context})
    # The pages hold no secret, but a shared machine's back button should not show them
    # after a logout; the script's own calls are never cached either.
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
        "frame-ancestors 'none'")
    return response


def _local(target: str) -> str:
    """Where the login may send the browser back to: a path of this site only."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


def rabbitmq_ui(settings: Settings) -> str:
    """The RabbitMQ management UI: RABBITMQ_MANAGEMENT_URL's first entry without its
    credentials, else port 15672 of the broker's host."""
    first = (settings.rabbitmq_management_url or "").split(",")[0].strip()
    if first:
        parts = urlsplit(first)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        return urlunsplit((parts.scheme, netloc, "/", "", ""))
    host = urlsplit(settings.rabbitmq_url.split(",")[0].strip()).hostname or "127.0.0.1"
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{RABBITMQ_MANAGEMENT_PORT}/"
