"""What a route depends on: the caller's token and scope, the settings, the Redis client.

Every route but the health check takes :data:`Reader` or :data:`Admin` (``caller: Admin``):
no anonymous call, and no write with a read-only token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

import redis
from fastapi import Depends, HTTPException, Request

from common.api.auth import AuthError, Caller
from common.core.config import Settings

#: The UI's login cookie (HttpOnly, SameSite=Strict): the same tokens as the bearer header.
COOKIE = "sf_token"


def require(scope: str) -> Callable[[Request], Caller]:
    """A route dependency: the caller, if its token (bearer header or the UI's cookie) has
    ``scope``; else 401 or 403."""

    def dependency(request: Request) -> Caller:
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else (
            request.cookies.get(COOKIE))
        try:
            caller = request.app.state.tokens.check(token)
        except AuthError as exc:
            raise HTTPException(exc.status, str(exc),
                                headers={"WWW-Authenticate": "Bearer"}) from None
        if not caller.allows(scope):
            raise HTTPException(403, f"this token's scope is {caller.scope}: {scope} needed")
        return caller

    return dependency


Reader = Annotated[Caller, Depends(require("read"))]
Admin = Annotated[Caller, Depends(require("admin"))]


def settings_of(request: Request) -> Settings:
    return request.app.state.settings


def redis_of(request: Request) -> redis.Redis:
    return request.app.state.redis


def unprocessable(*loc: str | int, message: str, kind: str = "value_error") -> HTTPException:
    """422 naming the field at ``loc`` (``"query", "limit"``; ``"body", "seeds", "urls", 0``),
    in FastAPI's own shape, so every route's bad input reads alike."""
    return HTTPException(422, [{"loc": list(loc), "msg": message, "type": kind}])
