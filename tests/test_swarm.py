"""Docker Swarm's files: docker-compose.yml alone, or with deploy/swarm/secrets.yml on top.

Static checks (no swarm here in CI); the "Docker Swarm" steps of docs/deployment.md were run on
a one-node Swarm with compose-e2e.sh's engine (NOTES). `docker stack config`, the loader of
`docker stack deploy`, renders the pair where a Docker CLI has it (25+). Passwords read from the
secrets' files: tests/core/test_config_files.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import REPO_ROOT, compose_config, env_example

SECRETS_FILE = "deploy/swarm/secrets.yml"
APP = ("scraper", "sink", "scheduler", "renderer", "downloader")
APP_UID = "10001"  # the Dockerfile's user


@pytest.fixture(scope="module")
def secrets() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / SECRETS_FILE).read_text())


@pytest.fixture(scope="module")
def base() -> dict[str, Any]:
    return yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())


def test_the_secrets_file_changes_only_the_stacks_services(secrets, base):
    assert set(secrets["services"]) <= set(base["services"])
    assert set(secrets["secrets"]) == {"fleet_rabbitmq_password", "fleet_redis_password"}
    assert all(s == {"external": True} for s in secrets["secrets"].values())


def test_the_fleets_services_read_their_passwords_from_files_only_they_can_read(secrets):
    for name in APP:
        service = secrets["services"][name]
        mounted = {s["target"]: s for s in service["secrets"]}
        assert service["environment"] == {
            "RABBITMQ_PASSWORD_FILE": "/run/secrets/rabbitmq_password",
            "REDIS_PASSWORD_FILE": "/run/secrets/redis_password"}, name
        for target in ("rabbitmq_password", "redis_password"):
            assert mounted[target]["mode"] == 0o400, name
            assert (mounted[target]["uid"], mounted[target]["gid"]) == (APP_UID, APP_UID), name


def test_rabbitmq_and_redis_read_the_secret_at_start_and_never_start_without_a_password(
        secrets, base):
    for name, target in (("rabbitmq", "rabbitmq_password"), ("redis", "redis_password")):
        (mounted,) = secrets["services"][name]["secrets"]
        assert mounted["target"] == target and mounted["mode"] == 0o400, name
        start = " ".join(base["services"][name].get("entrypoint") or base["services"][name][
            "command"])
        assert f"/run/secrets/{target}" in start, name
        assert "exit 78" in start, f"{name} must refuse to start with no password"
    assert "/run/secrets/redis_password" in " ".join(base["services"]["redis"]["healthcheck"][
        "test"])


def test_no_password_reaches_a_service_spec_when_deployed_as_the_docs_say(tmp_path):
    # docs/deployment.md: `RABBITMQ_PASSWORD= REDIS_PASSWORD= docker stack deploy -c
    # docker-compose.yml -c deploy/swarm/secrets.yml`: every service's environment carries them
    # empty.
    variables = {**env_example(), "RABBITMQ_PASSWORD": "", "REDIS_PASSWORD": ""}
    result = compose_config(tmp_path, variables, files=("docker-compose.yml", SECRETS_FILE))
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name, service in services.items():
        env = service.get("environment") or {}
        for key in ("RABBITMQ_PASSWORD", "REDIS_PASSWORD", "RABBITMQ_DEFAULT_PASS",
                    "REDISCLI_AUTH"):
            assert not env.get(key), (name, key)


def test_services_are_found_by_dns_so_a_kernel_without_ipvs_runs_the_stack(base):
    for name, service in base["services"].items():
        assert service["deploy"]["endpoint_mode"] == "dnsrr", name
        assert "ports" not in service, name  # dnsrr cannot publish through the ingress


def _docker_with_stack_config() -> str:
    for candidate in dict.fromkeys(c for c in (shutil.which("docker"), "/usr/local/bin/docker")
                                   if c and Path(c).is_file()):
        result = subprocess.run([candidate, "stack", "config", "--help"], capture_output=True,
                                text=True, timeout=30, stdin=subprocess.DEVNULL)
        if result.returncode == 0 and "--compose-file" in result.stdout:
            return candidate
    pytest.skip("no Docker CLI with `docker stack config`; the static checks above still ran")


def test_docker_stack_deploy_reads_the_pair(tmp_path):
    docker = _docker_with_stack_config()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_example(),
           "RABBITMQ_PASSWORD": "", "REDIS_PASSWORD": ""}
    result = subprocess.run([docker, "stack", "config", "-c", "docker-compose.yml", "-c",
                             SECRETS_FILE], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    stack = yaml.safe_load(result.stdout)["services"]
    for name in APP:
        assert stack[name]["environment"]["RABBITMQ_PASSWORD"] == "", name
        assert stack[name]["environment"]["REDIS_PASSWORD_FILE"] == "/run/secrets/redis_password"
        assert {s["source"] for s in stack[name]["secrets"]} == {
            "fleet_rabbitmq_password", "fleet_redis_password"}, name
