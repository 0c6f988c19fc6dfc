"""Who may call the control plane: bearer tokens stored hashed, two scopes, logins that create
tokens, failed logins rate-limited.

* **Tokens** (``api:tokens``): ``sf_`` + 32 random bytes (URL-safe base64), shown once when made
  (``scrape-fleet api token create NAME --scope read|admin [--ttl S]``) and stored only as their
  SHA-256 (a token is a random secret: a fast hash is enough, as for GitHub's tokens; a slow
  one would cost every API call). ``read`` may GET; ``admin`` may also change things.
* **Users** (``api:users``, ``scrape-fleet api user add NAME --scope …``): a password stored as
  scrypt (hashlib's, n=2^14, r=8, p=1, 16-byte salt). A login checks it and creates a token of
  the user's scope that expires after API_TOKEN_TTL_S, which the UI keeps in an HttpOnly cookie.
* **Failed logins** count per user name and per client address (``api:fails:{who}``); at
  API_LOGIN_ATTEMPTS within API_LOGIN_BLOCK_S the next login is refused with 429, right
  password or not, until the window ends.

No anonymous call exists: :func:`require` is a dependency of every route but the health check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

import redis

from common.store.keys import API_TOKENS, API_USERS, api_fails_key

SCOPES = ("read", "admin")
TOKEN_PREFIX = "sf_"
#: The name of a token a user's login made (a logout revokes those only).
LOGIN_PREFIX = "login:"
_SCRYPT = {"n": 2 ** 14, "r": 8, "p": 1, "dklen": 32}
#: What an unknown user name is checked against, so it takes a known one's time.
_NOBODY = {"scope": "read", "salt": base64.b64encode(b"\0" * 16).decode(),
           "hash": base64.b64encode(b"\0" * 32).decode()}


class AuthError(Exception):
    """Why a call or a login is refused: ``status`` 401 (who are you), 403 (not allowed),
    429 (too many failed logins)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Caller:
    """Who is calling: the token's name (or the user it was made for) and its scope."""

    name: str
    scope: str
    user: str = ""

    def allows(self, scope: str) -> bool:
        return scope == "read" or self.scope == "admin"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class Tokens:
    """The token and user store in Redis."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client

    # -- tokens ------------------------------------------------------------------------------
    def create(self, name: str, scope: str, ttl_s: int = 0, user: str = "") -> str:
        """A new token (returned once, never stored in clear)."""
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        if not name or len(name) > 100:
            raise ValueError("a token needs a name of 1 to 100 characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        self.client.hset(API_TOKENS, token_digest(token), json.dumps({
            "name": name, "scope": scope, "created": int(time.time()),
            "expires": int(time.time()) + ttl_s if ttl_s else 0, "user": user}))
        return token

    def check(self, token: str | None) -> Caller:
        """The caller a token stands for. Raises AuthError(401) for none, an unknown or an
        expired one."""
        if not token:
            raise AuthError(401, "a token is needed: Authorization: Bearer <token>")
        raw = self.client.hget(API_TOKENS, token_digest(token))
        if raw is None:
            raise AuthError(401, "unknown or revoked token")
        entry = json.loads(raw)
        if entry.get("expires") and entry["expires"] < time.time():
            self.client.hdel(API_TOKENS, token_digest(token))
            raise AuthError(401, "the token has expired: log in again")
        return Caller(entry["name"], entry["scope"], entry.get("user", ""))

    def revoke(self, name_or_token: str) -> int:
        """Revoke a token (given itself, or every token of that name). Returns how many."""
        if name_or_token.startswith(TOKEN_PREFIX):
            return self.client.hdel(API_TOKENS, token_digest(name_or_token))
        gone = [digest for digest, entry in self._entries() if entry["name"] == name_or_token]
        return self.client.hdel(API_TOKENS, *gone) if gone else 0

    def list(self) -> list[dict[str, Any]]:
        """Every token's name, scope, created, expires, user (never the token)."""
        return sorted((entry for _, entry in self._entries()), key=lambda e: e["created"])

    def _entries(self) -> list[tuple[bytes, dict[str, Any]]]:
        return [(digest, json.loads(raw))
                for digest, raw in self.client.hgetall(API_TOKENS).items()]

    # -- users -------------------------------------------------------------------------------
    def add_user(self, user: str, password: str, scope: str) -> None:
        if scope not in SCOPES:
            raise ValueError(f"scope must be one of {', '.join(SCOPES)}, got {scope!r}")
        if not user or len(user) > 100:
            raise ValueError("a user name needs 1 to 100 characters")
        if len(password) < 12:
            raise ValueError("a password needs at least 12 characters")
        salt = secrets.token_bytes(16)
        digest = hashlib.scrypt(password.encode("utf-8"), salt=salt, **_SCRYPT)
        self.client.hset(API_USERS, user, json.dumps({
            "scope": scope, "salt": base64.b64encode(salt).decode(),
            "hash": base64.b64encode(digest).decode()}))

    def login(self, user: str, password: str, address: str, ttl_s: int, attempts: int,
              block_s: int) -> str:
        """A token for a right user name and password. Raises AuthError(401) for a wrong one
        (counted), AuthError(429) while the name or the address is blocked."""
        keys = [api_fails_key(f"user:{user}"), api_fails_key(f"addr:{address}")]
        if any(int(n or 0) >= attempts for n in self.client.mget(keys)):
            raise AuthError(429, "too many failed logins: try again later")
        raw = self.client.hget(API_USERS, user)
        entry = json.loads(raw) if raw is not None else _NOBODY  # same work: no name oracle
        if not hmac.compare_digest(
                base64.b64decode(entry["hash"]),
                hashlib.scrypt(password.encode("utf-8"),
                               salt=base64.b64decode(entry["salt"]), **_SCRYPT)) or raw is None:
            with self.client.pipeline(transaction=True) as pipe:
                for key in keys:
                    pipe.incr(key)
                    pipe.expire(key, block_s, nx=True)
                pipe.execute()
            raise AuthError(401, "wrong user name or password")
        self.client.delete(keys[0])
        return self.create(f"{LOGIN_PREFIX}{user}", entry["scope"], ttl_s, user=user)

    def login_with_token(self, token: str, address: str, attempts: int, block_s: int
                         ) -> Caller:
        """The caller of a token given at the UI's login (a program's token, for a person who
        holds one). Wrong tokens count against the address like wrong passwords: 401, then
        429 while blocked."""
        key = api_fails_key(f"addr:{address}")
        if int(self.client.get(key) or 0) >= attempts:
            raise AuthError(429, "too many failed logins: try again later")
        try:
            return self.check(token)
        except AuthError:
            with self.client.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, block_s, nx=True)
                pipe.execute()
            raise
