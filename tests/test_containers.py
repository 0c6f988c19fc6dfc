"""Static checks of the container files: compose configuration and Dockerfile lint.

No Docker engine is needed: ``docker-compose config`` only parses, interpolates and merges
docker-compose.yml with docker-compose.override.yml (as `docker compose` does by itself), and
hadolint reads the Dockerfile. What users type, and Swarm's view of docker-compose.yml alone:
tests/test_compose_commands.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import compose_config, env_example, require_tool

REPO_ROOT = Path(__file__).resolve().parent.parent
ENV_EXAMPLE = REPO_ROOT / ".env.example"

APP_SERVICES = ("scraper", "sink", "producer", "sitemap_producer", "tools", "sink-postgres",
                "scheduler", "api")
TOOL_SERVICES = ("producer", "sitemap_producer", "tools")
#: What an official image's entrypoint needs to give its volume to its user and drop root.
ENTRYPOINT_CAPS = {"CHOWN", "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID"}


@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = compose_config(tmp_path_factory.mktemp("compose"), env_example())
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def _tmpfs_targets(service: dict[str, Any]) -> set[str]:
    return {v["target"] for v in service.get("volumes", [])
            if isinstance(v, dict) and v.get("type") == "tmpfs"}


def test_env_example_defines_every_required_secret():
    assert {"RABBITMQ_USER", "RABBITMQ_PASSWORD", "REDIS_PASSWORD"} <= set(env_example())


def test_compose_config_refuses_to_render_without_the_secrets(tmp_path):
    variables = env_example()
    del variables["RABBITMQ_PASSWORD"]

    result = compose_config(tmp_path, variables)

    assert result.returncode != 0
    assert "RABBITMQ_PASSWORD" in result.stderr


@pytest.mark.parametrize("variable", ["RABBITMQ_PASSWORD", "REDIS_PASSWORD"])
def test_compose_refuses_an_empty_password_and_swarm_takes_it_empty_for_its_secrets(
        tmp_path, variable):
    empty = {**env_example(), variable: ""}
    result = compose_config(tmp_path, empty)
    assert result.returncode != 0 and variable in result.stderr
    # docker-compose.yml alone (Swarm) takes it empty (deploy/swarm/secrets.yml), not unset.
    alone = compose_config(tmp_path, empty, files=("docker-compose.yml",))
    assert alone.returncode == 0, alone.stderr
    unset = {k: v for k, v in env_example().items() if k != variable}
    alone = compose_config(tmp_path, unset, files=("docker-compose.yml",))
    assert alone.returncode != 0 and variable in alone.stderr


def test_compose_has_the_broker_redis_worker_and_tool_services(compose):
    assert set(compose["services"]) == {
        "rabbitmq", "redis", "scraper", "api", "producer", "sitemap_producer", "tools",
        "prometheus", "grafana", "sink", "sink-postgres", "postgres", "scheduler", "image",
        "renderer", "render-image", "downloader", "minio"}


def test_the_image_is_built_once_and_never_over_fleet_image(tmp_path):
    # The defects: three services built the same image (dangling images), and with
    # FLEET_IMAGE=my-derived `up --build` overwrote the user's image with a plain build.
    services = yaml.safe_load(compose_config(
        tmp_path, {**env_example(), "FLEET_IMAGE": "my-fleet:1"}).stdout)["services"]
    builders = {name: s for name, s in services.items() if "build" in s}
    assert sorted(builders) == ["image", "render-image"]  # the plain image, the render target
    assert builders["image"]["image"] == "scrape-fleet:local"
    assert builders["image"]["deploy"]["replicas"] == 0, "builds, runs nothing"
    for name in APP_SERVICES:
        assert services[name]["image"] == "my-fleet:1", name
    base = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())["services"]
    assert not [name for name, s in base.items() if "build" in s], "Swarm builds nothing"


def test_scraper_can_scale_with_no_container_name_and_no_ports(compose):
    scraper = compose["services"]["scraper"]
    assert "container_name" not in scraper
    assert "ports" not in scraper
    assert scraper["command"] == ["python", "worker.py"]
    assert scraper["read_only"] is True
    assert "/tmp" in _tmpfs_targets(scraper)
    assert scraper["stop_grace_period"] == "60s"
    assert scraper["deploy"]["restart_policy"]["condition"] == "any"
    assert scraper["environment"]["RABBITMQ_HOST"] == "rabbitmq"
    assert scraper["environment"]["REDIS_HOST"] == "redis"


def test_a_plain_up_keeps_the_configured_number_of_scrapers(compose, tmp_path):
    # `docker compose up` (with or without --profile) reconciles to deploy.replicas; without
    # it every `up` went back to one scraper.
    assert compose["services"]["scraper"]["deploy"]["replicas"] == int(
        env_example()["SCRAPER_REPLICAS"])
    result = compose_config(tmp_path, {**env_example(), "SCRAPER_REPLICAS": "7"}, "monitoring")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["services"]["scraper"]["deploy"]["replicas"] == 7


def _published(service: dict[str, Any]) -> set[str]:
    return {(port if isinstance(port, str) else f"{port.get('host_ip')}:{port}")
            .removesuffix("/tcp") for port in service.get("ports", [])}


def test_published_ports_are_bound_to_loopback_only(compose):
    for name, service in compose["services"].items():
        assert all(spec.startswith("127.0.0.1:") for spec in _published(service)), name
    assert _published(compose["services"]["rabbitmq"]) == {"127.0.0.1:5672:5672",
                                                           "127.0.0.1:15672:15672"}
    assert _published(compose["services"]["redis"]) == {"127.0.0.1:6379:6379"}


def test_host_ports_are_set_in_env(tmp_path):
    # The defect: 5672/15672/6379 were fixed, so `up` failed with anything else on them.
    moved = {"PUBLISH_AMQP_PORT": "25672", "PUBLISH_RABBITMQ_UI_PORT": "25673",
             "PUBLISH_REDIS_PORT": "26379", "PUBLISH_PROMETHEUS_PORT": "29090",
             "PUBLISH_GRAFANA_PORT": "23000", "PUBLISH_POSTGRES_PORT": "25432"}
    assert set(moved) <= set(env_example())
    result = compose_config(tmp_path, {**env_example(), **moved}, "monitoring", "postgres")
    services = yaml.safe_load(result.stdout)["services"]
    assert _published(services["rabbitmq"]) == {"127.0.0.1:25672:5672",
                                                "127.0.0.1:25673:15672"}
    assert _published(services["redis"]) == {"127.0.0.1:26379:6379"}
    assert _published(services["prometheus"]) == {"127.0.0.1:29090:9090"}
    assert _published(services["grafana"]) == {"127.0.0.1:23000:3000"}
    assert _published(services["postgres"]) == {"127.0.0.1:25432:5432"}


def test_app_services_wait_for_healthy_broker_and_redis(compose):
    for name in ("scraper", *TOOL_SERVICES):
        depends_on = compose["services"][name]["depends_on"]
        assert depends_on == {"rabbitmq": {"condition": "service_healthy"},
                              "redis": {"condition": "service_healthy"}}, name
    assert "healthcheck" in compose["services"]["rabbitmq"]
    assert "healthcheck" in compose["services"]["redis"]


def test_tool_services_run_once_and_only_on_request(compose):
    for name in TOOL_SERVICES:
        service = compose["services"][name]
        assert service["profiles"] == ["tools"]
        assert service["restart"] == "no"
        assert service["image"] == compose["services"]["scraper"]["image"]


def test_every_app_service_shares_the_settings_of_the_scraper(compose):
    # The tools are defined in docker-compose.override.yml, the scraper in docker-compose.yml:
    # they must not drift apart.
    scraper = compose["services"]["scraper"]
    core = ("RABBITMQ_HOST", "RABBITMQ_USER", "RABBITMQ_PASSWORD", "REDIS_HOST",
            "REDIS_PASSWORD", "LOG_LEVEL", "EXTRACT_RULES", "EXTRACTOR")
    for name in APP_SERVICES:
        service = compose["services"][name]
        assert {k: service["environment"][k] for k in core} == {
            k: scraper["environment"][k] for k in core}, name
        assert service["image"] == scraper["image"], name
        assert service["read_only"] is True and service["init"] is True, name
        assert "/tmp" in _tmpfs_targets(service), name


def test_user_code_is_mounted_read_only_on_the_python_path(compose):
    for name in APP_SERVICES:
        mounts = [v for v in compose["services"][name]["volumes"] if isinstance(v, str)]
        assert f"{REPO_ROOT}/extensions:/app/extensions:ro" in mounts, name
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert "PYTHONPATH=/app/extensions" in dockerfile


def test_every_service_drops_capabilities_and_cannot_gain_privileges(compose):
    for name, service in compose["services"].items():
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        assert set(service.get("cap_add", [])) <= ENTRYPOINT_CAPS, name
    for name in APP_SERVICES + ("prometheus", "grafana"):
        assert "cap_add" not in compose["services"][name], name


def test_redis_runs_as_the_redis_user_with_its_password_on_no_command_line(compose):
    redis = compose["services"]["redis"]
    assert "user" not in redis
    command = " ".join(redis["command"])
    # The image drops root only when its entrypoint sees `redis-server` first.
    assert "exec docker-entrypoint.sh redis-server /run/redis/auth.conf" in command
    assert "requirepass" in command and "REDIS_PASSWORD" in command
    assert env_example()["REDIS_PASSWORD"] not in command
    assert "/run/redis" in _tmpfs_targets(redis)
    assert redis["read_only"] is True


def test_redis_keeps_an_append_only_file(compose):
    redis = compose["services"]["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command
    assert any(v.endswith(":/data") or ":/data:" in v for v in redis["volumes"]
               if isinstance(v, str))


def test_grafana_keeps_its_database_and_so_its_password_in_a_volume(compose):
    grafana = compose["services"]["grafana"]
    assert "grafana-data:/var/lib/grafana:rw" in grafana["volumes"]
    assert "grafana-data" in compose["volumes"]


def test_the_files_sink_runs_by_default_like_the_scraper_onto_a_named_volume(compose):
    sink, scraper = compose["services"]["sink"], compose["services"]["scraper"]
    assert "profiles" not in sink
    assert sink["command"] == ["python", "sink.py", "files"]
    assert sink["image"] == scraper["image"]
    assert sink["read_only"] is True and "/tmp" in _tmpfs_targets(sink)
    assert sink["deploy"]["restart_policy"]["condition"] == "any"
    assert sink["deploy"]["replicas"] == 1
    assert "ports" not in sink and "container_name" not in sink
    assert sink["depends_on"] == {"redis": {"condition": "service_healthy"}}
    sink_dir = sink["environment"]["SINK_DIR"]
    assert sink_dir.startswith("/") and not sink_dir.startswith("/tmp")
    assert f"sink-files:{sink_dir}:rw" in sink["volumes"]
    assert "sink-files" in compose["volumes"]


def test_the_tools_read_the_files_sinks_results(compose):
    # The defect: `docker compose run --rm tools python export.py` exported 0 records after a
    # crawl (the files sink had trimmed the stream; tools did not see the sink's volume).
    sink_dir = compose["services"]["sink"]["environment"]["SINK_DIR"]
    for name in TOOL_SERVICES:
        tool = compose["services"][name]
        assert tool["environment"]["SINK_DIR"] == sink_dir, name
        assert f"sink-files:{sink_dir}:ro" in tool["volumes"], name


def test_postgres_and_its_sink_are_the_postgres_profile(compose):
    postgres, sink = compose["services"]["postgres"], compose["services"]["sink-postgres"]
    assert postgres["profiles"] == sink["profiles"] == ["postgres"]
    image, _, tag = postgres["image"].partition(":")
    assert image == "postgres" and tag[:1].isdigit() and "." in tag, "pinned by tag"
    assert postgres["environment"]["POSTGRES_PASSWORD"] == env_example()["POSTGRES_PASSWORD"]
    assert any(v.endswith(":/var/lib/postgresql/data:rw") for v in postgres["volumes"])
    assert "healthcheck" in postgres
    assert sink["command"] == ["python", "sink.py", "postgres"]
    assert sink["restart"] == "unless-stopped"
    assert sink["read_only"] is True and "/tmp" in _tmpfs_targets(sink)
    assert sink["environment"]["POSTGRES_URL"].startswith("postgresql://")
    assert "@postgres:5432/" in sink["environment"]["POSTGRES_URL"]
    assert sink["depends_on"]["postgres"] == {"condition": "service_healthy"}


def test_compose_config_refuses_to_render_without_the_postgres_password(tmp_path):
    variables = env_example()
    del variables["POSTGRES_PASSWORD"]

    result = compose_config(tmp_path, variables, "postgres")

    assert result.returncode != 0
    assert "POSTGRES_PASSWORD" in result.stderr


def test_every_service_has_a_memory_limit(compose):
    # deploy.resources, which both Compose v2 and Swarm apply (Swarm ignores mem_limit).
    for name, service in compose["services"].items():
        assert service["deploy"]["resources"]["limits"]["memory"], name
        assert "mem_limit" not in service, name


def test_dockerfile_passes_hadolint():
    hadolint = require_tool("hadolint", Path(sys.executable).parent)

    result = subprocess.run([hadolint, "Dockerfile"], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)

    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_the_worker_as_a_non_root_user():
    lines = [line.strip() for line in (REPO_ROOT / "Dockerfile").read_text().splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith("FROM ")] + [len(lines)]
    images = [lines[a:b] for a, b in zip(starts, starts[1:], strict=False)]
    finals = [stage for stage in images if stage[0].split()[-1] in {"scraper", "renderer"}]
    assert len(finals) == 2, "the plain image and the render image"
    for stage in finals:  # each image's last USER is not root and comes after its last RUN
        user_lines = [line for line in stage if line.startswith("USER ")]
        assert user_lines and user_lines[-1] not in {"USER root", "USER 0", "USER 0:0"}
        assert stage.index(user_lines[-1]) > max(i for i, line in enumerate(stage)
                                                 if line.startswith("RUN ")), stage[0]
    assert 'CMD ["python", "worker.py"]' in lines
    assert not any(line.startswith("ENTRYPOINT") for line in lines)


def test_dockerignore_keeps_secrets_history_and_user_code_out_of_the_build_context():
    patterns = set((REPO_ROOT / ".dockerignore").read_text().split())
    assert {".git", ".env", ".venv", "bench/out", "extensions", "deploy"} <= patterns


def test_the_image_ships_the_app_only():
    # The defect: the image carried NOTES.md, bench/ and the dev requirements.
    lines = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    patterns = {line.strip() for line in lines if not line.startswith("#")}
    assert {"NOTES.md", "bench", "tests", "devtools", "scripts", "monitoring",
            "requirements-dev.txt", "requirements-dev.lock"} <= patterns
    assert "requirements.lock" not in patterns and "common" not in patterns


def test_the_app_user_has_a_home_and_the_image_no_setuid_file():
    dockerfile = (REPO_ROOT / "Dockerfile").read_text()
    assert "--create-home --home-dir /home/scraper" in dockerfile
    assert "--no-create-home" not in dockerfile
    # What Swarm keeps in place of no-new-privileges, which it drops.
    assert "-perm /6000 -exec chmod a-s" in dockerfile
