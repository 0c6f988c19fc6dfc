"""Static checks of monitoring/: the dashboard uses only exported metrics, Prometheus finds every
scraper replica, and the compose `monitoring` profile is wired to both. No server is needed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from common.work import metrics
from tests.helpers import compose_config, env_example

REPO_ROOT = Path(__file__).resolve().parent.parent
MONITORING = REPO_ROOT / "monitoring"
DASHBOARD = MONITORING / "grafana" / "dashboards" / "fleet.json"
PROMETHEUS_YML = MONITORING / "prometheus" / "prometheus.yml"
DATASOURCES = MONITORING / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = MONITORING / "grafana" / "provisioning" / "dashboards" / "fleet.yml"
METRIC_NAME = re.compile(r"\bfleet_[a-z_]+\b")
SAMPLE_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "counter": ("_total",),
                   "gauge": ("",)}


def _families() -> list[Metric]:
    return list(metrics.REGISTRY.collect())


def _sample_names() -> dict[str, str]:
    """Every series name a worker serves → the EXPORTED family it belongs to."""
    names = {}
    for family in _families():
        exported = family.name + ("_total" if family.type == "counter" else "")
        for suffix in SAMPLE_SUFFIXES[family.type]:
            names[family.name + suffix] = exported
    return names


def _expressions(dashboard: dict[str, Any]) -> list[str]:
    exprs = []
    for panel in dashboard["panels"]:
        for nested in [panel, *panel.get("panels", [])]:
            exprs += [target["expr"] for target in nested.get("targets", [])]
    return exprs


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def test_exported_lists_exactly_the_metric_families_in_the_registry():
    assert set(metrics.EXPORTED) == set(_sample_names().values())


def test_dashboard_is_json_with_a_stable_uid_and_unique_panel_ids(dashboard):
    assert dashboard["uid"] == "scrape-fleet"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(panel.get("targets") for panel in dashboard["panels"])


def test_every_metric_in_the_dashboard_is_one_the_workers_export(dashboard):
    served = _sample_names()
    used = {name for expr in _expressions(dashboard) for name in METRIC_NAME.findall(expr)}
    assert used, "no fleet_ metric found in the dashboard"
    assert used - set(served) == set(), "unknown metrics (not in common.work.metrics.EXPORTED)"


def test_every_exported_metric_has_a_place_on_the_dashboard(dashboard):
    served = _sample_names()
    used = {served[name] for expr in _expressions(dashboard) for name in METRIC_NAME.findall(expr)
            if name in served}
    assert set(metrics.EXPORTED) - used == set()


def test_the_dashboard_shows_the_promised_panels(dashboard):
    exprs = "\n".join(_expressions(dashboard))
    assert "sum by (outcome) (rate(fleet_fetches_total" in exprs
    assert "histogram_quantile(0.5, sum by (le) (rate(fleet_fetch_seconds_bucket" in exprs
    assert "histogram_quantile(0.95, sum by (le) (rate(fleet_fetch_seconds_bucket" in exprs
    assert "sum by (reason) (rate(fleet_dead_letters_total" in exprs
    assert "sum by (instance) (fleet_in_flight)" in exprs
    assert "fleet_cache_hits_total" in exprs and "fleet_cache_misses_total" in exprs


def test_expressions_have_balanced_brackets_and_counters_only_inside_rate_or_increase(dashboard):
    pairs = {")": "(", "]": "[", "}": "{"}
    for expr in _expressions(dashboard):
        stack: list[str] = []
        for char in expr:
            if char in "([{":
                stack.append(char)
            elif char in pairs:
                assert stack and stack.pop() == pairs[char], expr
        assert not stack, expr
        for name in re.findall(r"\bfleet_[a-z_]+_(?:total|bucket|sum|count)\b", expr):
            assert re.search(rf"\b(?:rate|increase)\({name}\[", expr), (name, expr)


def test_panels_use_the_provisioned_prometheus_datasource(dashboard):
    [source] = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert source["type"] == "prometheus"
    assert source["url"] == "http://prometheus:9090"
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": source["uid"]}
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == source["uid"]


def test_prometheus_scrapes_every_scraper_replica_on_port_9100_every_5_seconds():
    config = yaml.safe_load(PROMETHEUS_YML.read_text())
    [job] = [job for job in config["scrape_configs"] if job["job_name"] == "scraper"]
    assert job["scrape_interval"] == "5s"
    assert job["dns_sd_configs"] == [
        {"names": ["scraper"], "type": "A", "port": 9100, "refresh_interval": "15s"}]


# -- docker-compose, monitoring profile -----------------------------------------------------





@pytest.fixture(scope="module")
def compose(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    variables = {**env_example(), "GRAFANA_ADMIN_PASSWORD": "sentinel-grafana-password"}
    result = compose_config(tmp_path_factory.mktemp("compose"), variables, "monitoring")
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_prometheus_and_grafana_run_only_with_the_monitoring_profile(compose):
    for name in ("prometheus", "grafana"):
        assert compose["services"][name]["profiles"] == ["monitoring"], name
    assert "profiles" not in compose["services"]["scraper"]


def test_monitoring_images_are_pinned(compose):
    for name, repository in (("prometheus", "prom/prometheus"), ("grafana", "grafana/grafana")):
        image = compose["services"][name]["image"]
        repo, _, tag = image.partition(":")
        assert repo == repository and re.fullmatch(r"v?\d+\.\d+\.\d+", tag), image


def test_monitoring_ports_are_published_on_loopback_only(compose):
    assert compose["services"]["prometheus"]["ports"] == ["127.0.0.1:9090:9090/tcp"]
    assert compose["services"]["grafana"]["ports"] == ["127.0.0.1:3000:3000/tcp"]


def test_monitoring_config_is_mounted_read_only_where_the_files_expect_it(compose):
    prometheus = compose["services"]["prometheus"]
    assert f"{PROMETHEUS_YML}:/etc/prometheus/prometheus.yml:ro" in prometheus["volumes"]
    assert "--config.file=/etc/prometheus/prometheus.yml" in prometheus["command"]
    grafana = compose["services"]["grafana"]
    dashboards_path = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"][0][
        "options"]["path"]
    assert {f"{MONITORING}/grafana/provisioning:/etc/grafana/provisioning:ro",
            f"{DASHBOARD.parent}:{dashboards_path}:ro"} <= set(grafana["volumes"])


def test_grafana_admin_password_comes_from_the_environment(compose, tmp_path):
    grafana_env = compose["services"]["grafana"]["environment"]
    assert grafana_env["GF_SECURITY_ADMIN_PASSWORD"] == "sentinel-grafana-password"
    assert "GRAFANA_ADMIN_PASSWORD" in env_example()

    variables = env_example()
    del variables["GRAFANA_ADMIN_PASSWORD"]
    result = compose_config(tmp_path, variables, "monitoring")
    assert result.returncode != 0
    assert "GRAFANA_ADMIN_PASSWORD" in result.stderr


def test_scrapers_serve_metrics_on_9100_without_publishing_it(compose):
    scraper = compose["services"]["scraper"]
    assert str(scraper["environment"]["METRICS_PORT"]) == "9100"
    assert "ports" not in scraper
