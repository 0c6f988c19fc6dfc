"""Every setting reaches every compose service from .env, the same for all of them.

The compose files' settings blocks are generated from the knobs (devtools/compose_env.py); these
tests render the merged configuration as `docker compose` does (tests.helpers.compose_config)
and read each service's environment with the fleet's own :func:`load_settings`. What a real
engine showed: ../shared/tools/compose-e2e.sh (its "settings a compose user can set" line).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.core.config import KNOBS, Settings, load_settings
from devtools import compose_env
from tests.helpers import compose_config, env_example

#: Services running the fleet's image, in docker-compose.yml and in the override.
LONG_RUNNING = ("scraper", "sink", "scheduler", "api", "renderer", "downloader")
TOOLS = ("producer", "sitemap_producer", "tools", "sink-postgres")
#: Real passwords (the fleet refuses .env.example's placeholders).
PASSWORDS = {"RABBITMQ_PASSWORD": "r3al-rabbit", "REDIS_PASSWORD": "r3al-redis",
             "GRAFANA_ADMIN_PASSWORD": "r3al-grafana", "POSTGRES_PASSWORD": "r3al-pg"}


def render(tmp_path: Path, **variables: str) -> dict[str, Any]:
    result = compose_config(tmp_path, {**env_example(), **PASSWORDS, **variables}, "postgres")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def settings_of(service: dict[str, Any]) -> Settings:
    env = {k: "" if v is None else str(v) for k, v in service["environment"].items()}
    return load_settings(env)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return render(tmp_path_factory.mktemp("compose"))


def test_the_settings_blocks_are_generated_from_the_knobs():
    assert compose_env.main(["--check"]) == 0, "run `python -m devtools.compose_env`"


def test_a_stale_block_is_rewritten_and_a_missing_one_refused():
    text = "x: &a\n  # compose-env:start\n  OLD: 1\n  # compose-env:end\n"
    new = compose_env.render("docker-compose.override.yml", text)
    assert "OLD" not in new and all(f"  {k.env}: " in new for k in KNOBS)
    with pytest.raises(ValueError, match="expected one"):
        compose_env.render("docker-compose.yml", "x: 1\n")


def test_every_setting_of_the_readme_table_reaches_every_app_service(services):
    for name in (*LONG_RUNNING, *TOOLS):
        missing = [k.env for k in KNOBS if k.env not in services[name]["environment"]]
        assert missing == [], name


def test_a_setting_set_once_in_env_reaches_every_service_alike(tmp_path):
    # The defect: RATE_LIMIT reached the scrapers only, the producer deferred at 60/minute.
    fleet_wide = {"RATE_LIMIT": "5/second", "RATE_LIMITS": "slow.example=1/second",
                  "CRAWL_ENABLED": "true", "CRAWL_MAX_DEPTH": "4", "ROBOTS_ENABLED": "false",
                  "FETCH_ALLOW_NETWORKS": "10.0.0.0/8", "DEFER_LEAD_S": "3",
                  "ROUTING_RULES": '[{"pattern": "x", "queue": "priority_queue"}]'}
    services = render(tmp_path, **fleet_wide)
    seen = {name: settings_of(services[name]) for name in (*LONG_RUNNING, *TOOLS)}
    for name, settings in seen.items():
        assert settings.rate_limit == (5, 1000), name
        assert settings.rate_limit_overrides == (("slow.example", (1, 1000)),), name
        assert settings.crawl_enabled and settings.crawl_max_depth == 4, name
        assert not settings.robots_enabled and settings.defer_lead_s == 3, name
        assert [str(n) for n in settings.fetch_allow_networks] == ["10.0.0.0/8"], name
        assert settings.routing_rules == fleet_wide["ROUTING_RULES"], name


def test_settings_env_leaves_out_keep_their_defaults(services):
    defaults = Settings()
    compose_decides = {"rabbitmq_host", "rabbitmq_port", "redis_host", "redis_port", "sink_dir",
                       "rabbitmq_user", "rabbitmq_password", "redis_password", "worker_id",
                       "connect_retry_s", "archive_dir", "metrics_host", "metrics_port",
                       "postgres_url", "log_level", "api_host", "api_port"}
    # The download workers' store: MinIO of the media profile, a spool on their own volume.
    store = {"media_store", "s3_endpoint_url", "media_spool_dir"}
    for name in (*LONG_RUNNING, *TOOLS):
        settings = settings_of(services[name])
        decided = compose_decides | (store if name == "downloader" else set())
        changed = {k.attr for k in KNOBS if k.attr not in decided
                   and getattr(settings, k.attr) != getattr(defaults, k.attr)}
        assert changed == set(), name


def test_what_compose_decides_wins_over_env(tmp_path):
    services = render(tmp_path, RABBITMQ_HOST="localhost", REDIS_HOST="localhost",
                      RABBITMQ_PORT="5673", SINK_DIR="results", METRICS_HOST="127.0.0.1")
    for name in (*LONG_RUNNING, *TOOLS):
        settings = settings_of(services[name])
        assert (settings.rabbitmq_host, settings.rabbitmq_port) == ("rabbitmq", 5672), name
        assert (settings.redis_host, settings.redis_port) == ("redis", 6379), name
        assert settings.sink_dir == "/data/results", name
        assert settings.rabbitmq_password == PASSWORDS["RABBITMQ_PASSWORD"], name
    scraper = settings_of(services["scraper"])
    assert (scraper.metrics_host, scraper.metrics_port) == ("0.0.0.0", 9100)
    assert settings_of(services["sink-postgres"]).postgres_url.endswith("@postgres:5432/"
                                                                        "scrape_fleet")


def test_long_running_services_wait_for_rabbitmq_and_redis_and_the_tools_do_not(
        services, tmp_path):
    # Swarm ignores depends_on: a worker started before RabbitMQ waits instead of exiting 3.
    for name in LONG_RUNNING:
        assert math.isinf(settings_of(services[name]).connect_retry_s), name
    for name in TOOLS:
        assert settings_of(services[name]).connect_retry_s == Settings().connect_retry_s, name
    told = render(tmp_path, CONNECT_RETRY_S="90")
    assert {settings_of(told[n]).connect_retry_s for n in (*LONG_RUNNING, *TOOLS)} == {90}


def test_the_warc_archive_is_on_a_volume_the_tools_read(services):
    assert settings_of(services["scraper"]).archive_dir == "/data/archive"
    assert "warc-archive:/data/archive:rw" in services["scraper"]["volumes"]
    assert "warc-archive:/data/archive:ro" in services["tools"]["volumes"]


def test_the_control_plane_listens_on_its_container_address_published_on_loopback_only(
        tmp_path):
    # API_HOST defaults to 127.0.0.1: in a container nothing outside it could reach that.
    services = render(tmp_path, API_HOST="127.0.0.1", API_PORT="9999")
    api = services["api"]
    settings = settings_of(api)
    assert (settings.api_host, settings.api_port) == ("0.0.0.0", 8000)
    assert api["command"] == ["python", "api.py"]
    assert api["ports"] == ["127.0.0.1:8000:8000/tcp"]  # as Debian's docker-compose renders
    assert "http://127.0.0.1:8000/api/health" in " ".join(api["healthcheck"]["test"])
    assert {name: dep["condition"] for name, dep in api["depends_on"].items()} == {
        "rabbitmq": "service_healthy", "redis": "service_healthy"}
    for name, service in services.items():  # every other published port: loopback too
        assert all(p.startswith("127.0.0.1:") for p in service.get("ports", [])), name


def test_download_workers_store_into_the_media_profiles_minio_unless_env_names_another(
        services, tmp_path):
    downloader = settings_of(services["downloader"])
    assert (downloader.media_store, downloader.s3_endpoint_url) == ("s3://assets",
                                                                    "http://minio:9000")
    assert downloader.media_spool_dir == "/data/spool"
    env = services["downloader"]["environment"]
    # MinIO's account is the workers' S3 credentials, which the S3 client reads itself.
    shipped = env_example()
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == (
        shipped["MINIO_ROOT_USER"], shipped["MINIO_ROOT_PASSWORD"])
    assert not any(k.startswith("AWS_") for k in services["scraper"]["environment"])
    # Only the download workers get the store's address; the others keep the default.
    assert settings_of(services["scraper"]).media_store == Settings().media_store
    elsewhere = render(tmp_path, MEDIA_STORE="s3://catalogue/shop",
                       S3_ENDPOINT_URL="https://s3.eu-west-1.amazonaws.com")
    told = settings_of(elsewhere["downloader"])
    assert (told.media_store, told.s3_endpoint_url) == ("s3://catalogue/shop",
                                                        "https://s3.eu-west-1.amazonaws.com")
