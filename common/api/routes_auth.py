"""Logins for the web UI: a user name and password (``scrape-fleet api user add``) make a token
that expires after API_TOKEN_TTL_S — or a token given as it is (``scrape-fleet api token
create``) — kept in the HttpOnly, SameSite=Strict cookie ``sf_token``
(common/api/deps.py COOKIE), which every route then takes as it takes a bearer token.

Failed logins count per user name and per client address: at API_LOGIN_ATTEMPTS within
API_LOGIN_BLOCK_S the next one is refused with 429 (common/api/auth.py). A logout revokes the
cookie's token and clears the cookie.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, HTTPException, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from common.api.auth import LOGIN_PREFIX, TOKEN_PREFIX, AuthError
from common.api.deps import COOKIE, Reader, settings_of, unprocessable


class Login(BaseModel):
    """A user name and password, or a token (``scrape-fleet api token create``)."""

    model_config = ConfigDict(extra="forbid")
    user: str | None = Field(None, min_length=1, max_length=100)
    password: str | None = Field(None, min_length=1, max_length=1000)
    token: str | None = Field(None, min_length=1, max_length=200)


def include(app: FastAPI) -> None:
    @app.post("/api/login", tags=["auth"])
    def login(asked: Login, request: Request, response: Response) -> dict[str, Any]:
        """A user's login: sets the ``sf_token`` cookie (HttpOnly, SameSite=Strict) to a token
        of the user's scope; 401 for a wrong name or password, 429 after too many."""
        settings = settings_of(request)
        tokens = request.app.state.tokens
        address = request.client.host if request.client else "unknown"
        missing = ("token" if asked.user is not None or asked.password is not None else None
                   ) if asked.token is not None else (
            "user" if asked.user is None else "password" if asked.password is None else None)
        if missing is not None:
            raise unprocessable("body", missing,
                                message="give a user and a password, or a token (not both)")
        try:
            if asked.token is not None:
                token = asked.token
                tokens.login_with_token(token, address, settings.api_login_attempts,
                                        settings.api_login_block_s)
            else:
                token = tokens.login(asked.user, asked.password, address,
                                     settings.api_token_ttl_s, settings.api_login_attempts,
                                     settings.api_login_block_s)
        except AuthError as exc:
            raise HTTPException(exc.status, str(exc)) from None
        caller = tokens.check(token)
        response.set_cookie(COOKIE, token, max_age=settings.api_token_ttl_s or None,
                            httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
        return {"user": caller.user, "scope": caller.scope}

    @app.post("/api/logout", tags=["auth"])
    def logout(caller: Reader, request: Request, response: Response) -> dict[str, Any]:
        """Revoke the token a user's login made and clear the cookie (a program's token
        someone logged in with stays valid, as does a bearer token)."""
        token = request.cookies.get(COOKIE)
        # Only a token: a cookie holding a name must not revoke every token of that name.
        revoked = (request.app.state.tokens.revoke(token)
                   if token and token.startswith(TOKEN_PREFIX)
                   and caller.name.startswith(LOGIN_PREFIX) else 0)
        response.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
        return {"revoked": revoked}

    @app.get("/api/whoami", tags=["auth"])
    def whoami(caller: Reader) -> dict[str, Any]:
        """The token's name and scope, and the user it was made for (a login's)."""
        return {"name": caller.name, "scope": caller.scope, "user": caller.user}
