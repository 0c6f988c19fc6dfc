"""The offline rules checker over HTTP: rules and a URL (fetched once) or pasted HTML → the data
the first matching rule extracts and the links it keeps, as ``scrape-fleet try`` reads them
(common/ops/cli_try.py: the same functions).

A URL is fetched through the fleet's own Fetcher and address guard (FETCH_ALLOW_NETWORKS): a
URL whose address the guard refuses is answered 422 naming ``url`` with the guard's reason,
never fetched. The fleet's HANDLERS router, when set, runs on the page too (``label`` as if a
follow request had named it). The request body is read up to a cap (twice MAX_BODY_BYTES,
room for JSON escapes: 413 above it) and pasted HTML is held to MAX_BODY_BYTES (413), as a
fetched body is.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from common.api.deps import Admin, settings_of, unprocessable
from common.core.config import Settings
from common.core.errors import ConfigError, FetchError, FleetError
from common.core.redact import scrub
from common.ops.cli_try import NoRule, extractor_of, fetch_page, read_page
from common.work.user_code import load_router

#: Where pasted HTML is taken to come from when no base_url is given (a reserved name).
PASTED_BASE = "https://example.invalid/"
MAX_URL_CHARS = 8192


class RulesCheck(BaseModel):
    """Rules and the page to try them on: exactly one of ``url`` and ``html``."""

    model_config = ConfigDict(extra="forbid")
    rules: dict[str, Any] | list[Any] = Field(
        description="EXTRACT_RULES as JSON: a list of rules, or {'rules': [...]}")
    url: str | None = Field(None, max_length=MAX_URL_CHARS,
                            description="an http(s) URL, fetched once through the address guard")
    html: str | None = Field(None, description="a page's HTML, pasted")
    base_url: str | None = Field(None, max_length=MAX_URL_CHARS,
                                 description="the URL the pasted HTML came from (rules match it)")
    label: str | None = Field(None, max_length=200,
                              description="the handler a follow request named (HANDLERS)")


def _http_url(value: str, field: str) -> str:
    if not value.startswith(("http://", "https://")):
        raise unprocessable("body", field, message="expected an http(s) URL")
    return value


async def _body(request: Request, cap: int) -> RulesCheck:
    """The request body read up to ``cap`` bytes (413 above it), validated (422 naming the
    field)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > cap:
        raise HTTPException(413, f"the request body is over {cap:,} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise HTTPException(413, f"the request body is over {cap:,} bytes")
        chunks.append(chunk)
    try:
        return RulesCheck.model_validate_json(b"".join(chunks))
    except ValidationError as exc:
        raise HTTPException(422, [{"loc": ["body", *e["loc"]], "msg": e["msg"],
                                   "type": e["type"]} for e in exc.errors()]) from None


def check(settings: Settings, asked: RulesCheck) -> dict[str, Any]:
    """What the rules give on the page (blocking: fetches, parses, runs user code)."""
    if (asked.url is None) == (asked.html is None):
        raise unprocessable("body", "url", message="give exactly one of url and html")
    if asked.base_url is not None and asked.html is None:
        raise unprocessable("body", "base_url", message="base_url goes with html only")
    if asked.html is not None and len(asked.html.encode("utf-8")) > settings.max_body_bytes:
        raise HTTPException(413, [{"loc": ["body", "html"], "type": "value_error",
                                   "msg": f"over MAX_BODY_BYTES={settings.max_body_bytes:,}"}])
    warnings: list[str] = []
    try:
        extractor = extractor_of(json.dumps(asked.rules, ensure_ascii=False), settings,
                                 warn=warnings.append)
    except ConfigError as exc:
        raise unprocessable("body", "rules", message=str(exc)) from None
    router = None
    if settings.handlers.strip():
        try:
            router = load_router(settings.handlers)
        except ConfigError as exc:  # the server's own setting: not the caller's mistake
            raise HTTPException(500, scrub(str(exc), settings.secrets())) from None
    if asked.url is not None:
        try:
            body, url, content_type = fetch_page(_http_url(asked.url, "url"), settings)
        except FetchError as exc:
            if exc.kind in ("blocked", "invalid"):
                raise unprocessable("body", "url", message=str(exc)) from None
            raise HTTPException(502, f"fetching {asked.url}: {exc}") from None
        except FleetError as exc:
            raise HTTPException(502, str(exc)) from None
    else:
        body, content_type = asked.html.encode("utf-8"), "text/html; charset=utf-8"
        url = _http_url(asked.base_url or PASTED_BASE, "base_url")
    try:
        reading = read_page(body, url, content_type, settings, extractor, router, asked.label)
    except NoRule as exc:
        raise unprocessable("body", "rules", message=str(exc)) from None
    out = reading.out
    return {**{k: v for k, v in out.items() if k != "rule_follow"},
            "data": out.get("data"),
            "links": out.get("rule_follow", list(reading.page.links)),
            "links_from": "rule" if "rule_follow" in out else "page",
            "record": {**reading.page.to_dict(), **reading.record},
            "warnings": warnings}


def include(app: FastAPI) -> None:
    body_schema = {"required": True, "content": {
        "application/json": {"schema": RulesCheck.model_json_schema()}}}

    @app.post("/api/rules/check", tags=["rules"], openapi_extra={"requestBody": body_schema})
    async def rules_check(caller: Admin, request: Request) -> dict[str, Any]:
        """Try rules on a URL (fetched through the address guard) or on pasted HTML: the
        extracted data, the links kept, the record. Nothing is queued or stored."""
        settings = settings_of(request)
        asked = await _body(request, 2 * settings.max_body_bytes + 65536)
        return await run_in_threadpool(check, settings, asked)
