"""The API service: one FastAPI application, its routes in ``common/api/routes_*.py``.

:func:`create_app` builds it from the fleet's settings: a Redis client shared by every request
(redis-py's pool is thread-safe), the token store (common/api/auth.py), CORS only for the
origins API_CORS_ORIGINS names, and every route but ``GET /api/health`` behind
:func:`common.api.deps.require`. OpenAPI at ``/api/openapi.json``, its interactive page at ``/api/docs``.
Bad input is answered 422 naming the field (FastAPI's validation errors, ``loc``), a refused
token 401 or 403, too many failed logins 429.

``scrape-fleet api`` serves it with uvicorn on API_HOST:API_PORT.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

import redis
from fastapi import FastAPI, HTTPException
from fastapi.middleware.cors import CORSMiddleware

import common.api as api_package
from common.api.auth import Tokens
from common.core.config import Settings
from common.store.connection import connect_redis

VERSION = "0.3.0"


def create_app(settings: Settings, client: redis.Redis | None = None) -> FastAPI:
    """The application; ``client``: a Redis client to use (default: connect_redis)."""
    app = FastAPI(title="scrape-fleet control plane", version=VERSION,
                  openapi_url="/api/openapi.json", docs_url="/api/docs", redoc_url=None)
    app.state.settings = settings
    app.state.redis = client if client is not None else connect_redis(settings)
    app.state.tokens = Tokens(app.state.redis)
    origins = [o.strip() for o in settings.api_cors_origins.split(",") if o.strip()]
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=origins, allow_credentials=False,
                           allow_methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                           allow_headers=["Authorization", "Content-Type"])

    @app.get("/api/health", tags=["fleet"])
    def health() -> dict[str, str]:
        """Alive, and Redis answers (no token needed: the probes' call)."""
        try:
            app.state.redis.ping()
        except redis.RedisError as exc:
            raise HTTPException(503, f"Redis: {type(exc).__name__}") from None
        return {"status": "ok"}

    for include in _routers():
        include(app)
    return app


def _routers() -> list[Callable[[FastAPI], None]]:
    """Every ``common/api/routes_*.py`` module's ``include(app)``, in name order (the OpenAPI
    document's), then the UI's (``common/api/ui*.py``)."""
    names = sorted(m.name for m in pkgutil.iter_modules(api_package.__path__)
                   if m.name.startswith("routes_"))
    names += sorted(m.name for m in pkgutil.iter_modules(api_package.__path__)
                    if m.name == "ui")
    return [importlib.import_module(f"common.api.{name}").include for name in names]
