"""``scrape-fleet api`` / ``python api.py`` (common/api/cli.py): tokens made, listed and revoked
from the command line and working against the API; users added with the password on standard
input, never as an argument; the API served on the port given."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import requests

from common.store.keys import API_USERS
from tests.api.conftest import _free_port
from tests.helpers import REPO_ROOT, TEST_ENV

PASSWORD = "correct horse battery"


def test_token_create_prints_only_the_token_and_it_works_against_the_api(api, run_cli):
    made = run_cli("api.py", "token", "create", "ci", "--scope", "read")
    assert made.returncode == 0, made.stderr
    [token] = made.stdout.splitlines()
    assert token.startswith("sf_") and "shown once" in made.stderr
    who = api.call("GET", "/api/whoami", token=token)
    assert who.status_code == 200 and who.json()["name"] == "ci"
    assert who.json()["scope"] == "read"
    assert api.call("POST", "/api/dead-letters/replay", token=token, json={}).status_code == 403


def test_token_list_never_shows_a_token_and_revoke_makes_it_401(api, run_cli):
    token = run_cli("api.py", "token", "create", "deploy", "--scope", "admin",
                    "--ttl", "3600").stdout.strip()
    listing = run_cli("api.py", "token", "list")
    assert listing.returncode == 0, listing.stderr
    assert token not in listing.stdout and "sf_" not in listing.stdout
    [row] = [line for line in listing.stdout.splitlines() if line.startswith("deploy ")]
    assert " admin " in row and "never" not in row  # it expires
    assert api.call("GET", "/api/whoami", token=token).status_code == 200
    revoked = run_cli("api.py", "token", "revoke", "deploy")
    assert revoked.returncode == 0 and "revoked 1" in revoked.stdout
    assert api.call("GET", "/api/whoami", token=token).status_code == 401
    again = run_cli("api.py", "token", "revoke", "deploy")
    assert again.returncode == 1 and "revoked 0" in again.stdout


def test_user_add_takes_the_password_from_stdin_and_the_user_can_log_in(api, run_cli,
                                                                         redis_client):
    added = run_cli("api.py", "user", "add", "ana", "--scope", "admin",
                    input_text=PASSWORD + "\n")
    assert added.returncode == 0, added.stderr
    assert PASSWORD.encode() not in redis_client.hget(API_USERS, "ana")
    login = requests.post(f"{api.url}/api/login", json={"user": "ana", "password": PASSWORD},
                          timeout=30)
    assert login.status_code == 200 and login.json() == {"user": "ana", "scope": "admin"}
    short = run_cli("api.py", "user", "add", "bob", "--scope", "read", input_text="short\n")
    assert short.returncode == 2 and "12 characters" in short.stderr


def test_a_password_on_the_command_line_is_refused(run_cli, redis_client):
    refused = run_cli("api.py", "user", "add", "ana", "--scope", "admin", "--password",
                      PASSWORD, input_text=PASSWORD + "\n")
    assert refused.returncode == 2 and "--password is refused" in refused.stderr
    assert redis_client.hget(API_USERS, "ana") is None
    bad_scope = run_cli("api.py", "token", "create", "x", "--scope", "root")
    assert bad_scope.returncode == 2 and bad_scope.stdout == ""


def test_api_serves_on_the_port_given_and_the_console_lists_the_command(settings, redis_client):
    port = _free_port()
    env = dict(os.environ, **TEST_ENV, RABBITMQ_URL=settings.rabbitmq_url,
               REDIS_URL=settings.redis_url)
    server = subprocess.Popen([sys.executable, "api.py", "--host", "127.0.0.1", "--port",
                               str(port)], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                health = requests.get(f"http://127.0.0.1:{port}/api/health", timeout=2)
                break
            except requests.ConnectionError:
                assert server.poll() is None, server.stderr.read()
                assert time.monotonic() < deadline, "the API did not start"
                time.sleep(0.1)
        assert health.json() == {"status": "ok"}
        assert requests.get(f"http://127.0.0.1:{port}/api/workers",
                            timeout=5).status_code == 401
    finally:
        server.terminate()
        server.wait(30)
    usage = subprocess.run([sys.executable, "-m", "common.ops.console", "api", "--help"],
                           cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert usage.returncode == 0 and "usage: scrape-fleet api" in usage.stdout
