"""Who may call the control plane (common/api/auth.py): no call without a token, no write with
a read-only one, tokens stored hashed, logins that make expiring tokens, failed logins
refused after API_LOGIN_ATTEMPTS."""

from __future__ import annotations

import dataclasses
import time

import pytest

from common.api.auth import AuthError, Tokens, token_digest
from common.store.keys import API_TOKENS, API_USERS


def test_the_health_check_answers_without_a_token(api):
    answer = api.call("GET", "/api/health", token=None)
    assert answer.status_code == 200 and answer.json() == {"status": "ok"}


def test_a_token_is_stored_only_as_its_hash_and_checked_with_its_scope(redis_client):
    tokens = Tokens(redis_client)
    token = tokens.create("ci", "read")
    assert token.startswith("sf_") and len(token) > 40
    stored = redis_client.hgetall(API_TOKENS)
    assert list(stored) == [token_digest(token).encode()]
    assert token.encode() not in b"".join(stored.values())
    caller = tokens.check(token)
    assert (caller.name, caller.scope, caller.allows("read"), caller.allows("admin")) == (
        "ci", "read", True, False)
    assert tokens.revoke("ci") == 1
    with pytest.raises(AuthError) as refused:
        tokens.check(token)
    assert refused.value.status == 401


def test_an_expired_token_is_refused_and_forgotten(redis_client):
    tokens = Tokens(redis_client)
    token = tokens.create("short", "admin", ttl_s=1)
    assert tokens.check(token).scope == "admin"
    time.sleep(1.1)
    with pytest.raises(AuthError, match="expired"):
        tokens.check(token)
    assert redis_client.hlen(API_TOKENS) == 0


def test_a_login_makes_a_token_of_the_users_scope_and_wrong_ones_are_blocked(redis_client):
    tokens = Tokens(redis_client)
    tokens.add_user("ana", "correct horse battery", "read")
    assert b"correct horse" not in redis_client.hget(API_USERS, "ana")
    token = tokens.login("ana", "correct horse battery", "127.0.0.1", 60, 3, 60)
    assert tokens.check(token).scope == "read" and tokens.check(token).user == "ana"
    for _ in range(3):
        with pytest.raises(AuthError) as wrong:
            tokens.login("ana", "wrong password!", "127.0.0.2", 60, 3, 60)
        assert wrong.value.status == 401
    with pytest.raises(AuthError) as blocked:  # even the right password now
        tokens.login("ana", "correct horse battery", "127.0.0.3", 60, 3, 60)
    assert blocked.value.status == 429
    with pytest.raises(AuthError) as nobody:
        tokens.login("nobody", "whatever password", "127.0.0.9", 60, 3, 60)
    assert nobody.value.status == 401


def test_bad_users_and_scopes_are_refused(redis_client):
    tokens = Tokens(redis_client)
    with pytest.raises(ValueError, match="scope"):
        tokens.create("x", "root")
    with pytest.raises(ValueError, match="12 characters"):
        tokens.add_user("bob", "short", "admin")
    assert dataclasses.is_dataclass(tokens.check(tokens.create("y", "admin")))
