"""The Kubernetes manifests (deploy/k8s), checked offline, no cluster needed.

Both overlays render with ``kubectl kustomize``; every rendered object validates against its
schema: the built-in kinds with kubernetes-validate (strict: an unknown field fails, as with
``kubectl apply``'s server-side field validation), the custom resources (RabbitmqCluster,
ScaledObject, TriggerAuthentication, ServiceMonitor) with the published CRD schemas kept in
deploy/k8s/schemas, made strict the same way. Then the fleet's promises are checked in the
rendered objects: health probes, the SIGTERM drain, sizing from the measured RSS, non-root
read-only pods, credentials from Secrets only, quorum queues, Sentinel, KEDA on the work
queues. What no offline check can tell (the operators' behaviour, scheduling, DNS):
docs/deployment.md, "Kubernetes".
"""

from __future__ import annotations

import base64
import copy
import re
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from common.broker import topology
from common.core.knobs import KNOBS
from common.work.worker import SHUTDOWN_GRACE_S
from tests.helpers import REPO_ROOT, require_tool

K8S = REPO_ROOT / "deploy" / "k8s"
SCHEMAS = K8S / "schemas"
OVERLAYS = ("local", "prod")
#: Variables the S3 client reads itself (the download workers' keys): never a fleet setting.
S3_CLIENT_VARIABLES = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
#: The oldest Kubernetes the manifests are written for, and the newest the validator knows.
K8S_VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())
POD_KINDS = {"Deployment", "StatefulSet", "Job", "CronJob"}
KNOWN_SETTINGS = {knob.env for knob in KNOBS}


def _render(overlay: str, workdir: Path) -> list[dict[str, Any]]:
    kubectl = require_tool("kubectl")
    tree = workdir / "k8s"
    shutil.copytree(K8S, tree)
    if overlay == "local":
        # What docs/deployment.md has a user generate; never committed (overlays/local/.gitignore).
        (tree / "overlays" / "local" / "redis-password").write_text(secrets.token_hex(24))
    result = subprocess.run([kubectl, "kustomize", str(tree / "overlays" / overlay)],
                            capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return {overlay: _render(overlay, tmp_path_factory.mktemp(overlay)) for overlay in OVERLAYS}


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name, [d["metadata"]["name"] for d in docs])
    return found[0]


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


# -- schemas --------------------------------------------------------------------------------

def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the CRD lists the fields (what the API
    server's strict field validation does), except where it keeps unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def _crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    schemas = {}
    for path in sorted(SCHEMAS.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        assert doc["source"] and doc["version"], path
        schemas[(doc["apiVersion"], doc["kind"])] = _strict(doc["openAPIV3Schema"])
    return schemas


CRD_SCHEMAS = _crd_schemas()
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _schema_errors(obj: dict[str, Any]) -> list[str]:
    """Every schema error of one object, for every version in K8S_VERSIONS."""
    key = (obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']}/{obj['metadata'].get('name')}"
    if key in CRD_SCHEMAS:
        validator = jsonschema.Draft7Validator(CRD_SCHEMAS[key])
        errors = [f"{where}: {'.'.join(map(str, e.path))}: {e.message}"
                  for e in validator.iter_errors(obj)]
        if not DNS_SUBDOMAIN.fullmatch(obj["metadata"]["name"]):
            errors.append(f"{where}: not a DNS subdomain name")
        return errors
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where} (k8s {version}): {'.'.join(map(str, exc.path))}: "
                          f"{exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(f"{where}: no schema: {exc.message}")
    return errors


def test_both_overlays_render_every_part_of_the_fleet(rendered):
    for overlay, docs in rendered.items():
        kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
        assert {("Namespace", "scrape-fleet"), ("RabbitmqCluster", "rabbitmq"),
                ("StatefulSet", "redis"), ("Deployment", "scraper"), ("ScaledObject", "scraper"),
                ("Deployment", "renderer"), ("ScaledObject", "renderer"),
                ("Deployment", "downloader"), ("ScaledObject", "downloader"),
                ("ConfigMap", "media-store"),
                ("Job", "producer"), ("CronJob", "sitemap-producer"), ("Deployment", "sink"),
                ("PersistentVolumeClaim", "sink-files")} <= kinds, overlay
        assert all(d["metadata"].get("namespace") == "scrape-fleet"
                   for d in docs if d["kind"] != "Namespace"), overlay


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_rendered_object_validates_against_its_schema(rendered, overlay):
    errors = [error for doc in rendered[overlay] for error in _schema_errors(doc)]
    assert errors == []


def test_the_validation_refuses_what_the_api_server_would(rendered):
    docs = rendered["prod"]
    deployment = copy.deepcopy(_one(docs, "Deployment", "scraper"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    scaled = copy.deepcopy(_one(docs, "ScaledObject", "scraper"))
    scaled["spec"]["maxReplicas"] = 5
    cluster = copy.deepcopy(_one(docs, "RabbitmqCluster", "rabbitmq"))
    cluster["spec"]["replicas"] = "3"
    monitor = copy.deepcopy(_one(docs, "ServiceMonitor", "scraper"))
    del monitor["spec"]["selector"]
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}

    for broken in (deployment, scaled, cluster, monitor, unknown):
        assert _schema_errors(broken), broken["kind"]


# -- the scraper ----------------------------------------------------------------------------

def _worker(docs: list[dict[str, Any]], name: str = "scraper") -> dict[str, Any]:
    (container,) = _pod_spec(_one(docs, "Deployment", name))["containers"]
    return container


def test_scrapers_probe_the_health_endpoint_on_the_metrics_port(rendered):
    for docs in rendered.values():
        worker = _worker(docs)
        metrics_port = int(_env(worker)["METRICS_PORT"]["value"])
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        for probe in (worker["readinessProbe"], worker["livenessProbe"]):
            assert probe["httpGet"]["path"] == "/healthz"
            assert ports[probe["httpGet"]["port"]] == metrics_port
        annotations = _one(docs, "Deployment", "scraper")["spec"]["template"]["metadata"][
            "annotations"]
        assert annotations["prometheus.io/port"] == str(metrics_port)
        # The probes and Prometheus reach the pod's address; the default is loopback only.
        assert _env(worker)["METRICS_HOST"]["value"] == "0.0.0.0"


def test_a_scraper_gets_longer_to_stop_than_the_worker_drains(rendered):
    for docs in rendered.values():
        grace = _pod_spec(_one(docs, "Deployment", "scraper"))["terminationGracePeriodSeconds"]
        assert grace >= SHUTDOWN_GRACE_S + 10


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(Mi|Gi)", quantity).groups()
    return float(number) * (1024 if unit == "Gi" else 1)


def test_scraper_memory_is_sized_from_the_measured_worker_rss(rendered):
    # The newest bench run comes first in bench/RESULTS.md (its RSS is VmHWM/1024: MiB).
    results = (REPO_ROOT / "bench" / "RESULTS.md").read_text()
    rss_mib = float(re.search(r"^worker peak RSS\s+([\d.]+)\s+MB", results, re.M).group(1))
    defaults = {knob.env: knob.default for knob in KNOBS}
    for docs in rendered.values():
        worker = _worker(docs)
        concurrency = int(_env(worker)["WORKER_CONCURRENCY"]["value"])
        bodies_mib = concurrency * int(defaults["MAX_BODY_BYTES"]) / 2**20
        assert concurrency == int(defaults["WORKER_CONCURRENCY"]), "the benchmark's setting"
        assert _mib(worker["resources"]["requests"]["memory"]) >= rss_mib
        assert _mib(worker["resources"]["limits"]["memory"]) >= rss_mib + bodies_mib


def test_every_fleet_pod_is_non_root_with_a_read_only_root_and_no_capabilities(rendered):
    # The "restricted" Pod Security Standard, for the pods this repository defines.
    for docs in rendered.values():
        for obj in (d for d in docs if d["kind"] in POD_KINDS):
            pod = _pod_spec(obj)
            assert pod["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
            assert pod["securityContext"]["runAsUser"] > 0
            assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            assert pod["automountServiceAccountToken"] is False
            for container in pod["containers"]:
                context = container["securityContext"]
                assert context["allowPrivilegeEscalation"] is False, container["name"]
                assert context["readOnlyRootFilesystem"] is True, container["name"]
                assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
                assert container["resources"]["limits"]["memory"], container["name"]


# -- credentials and settings ---------------------------------------------------------------

def test_credentials_come_from_secrets_and_never_from_the_manifests(rendered):
    secret_name = re.compile(r"PASSWORD|AUTH|SECRET|TOKEN|ACCESS_KEY")
    for overlay, docs in rendered.items():
        for obj in (d for d in docs if d["kind"] in POD_KINDS):
            for container in _pod_spec(obj)["containers"]:
                for name, var in _env(container).items():
                    if secret_name.search(name):
                        assert "secretKeyRef" in var.get("valueFrom", {}), (overlay, name)
                urls = _env(container).get("RABBITMQ_URLS", {}).get("value", "")
                for url in filter(None, urls.split(",")):
                    assert "//$(RABBITMQ_USER):$(RABBITMQ_PASSWORD)@" in url, url
        for config in (d for d in docs if d["kind"] == "ConfigMap"):
            assert not any(secret_name.search(key) for key in config["data"]), config
    assert [d for d in rendered["prod"] if d["kind"] == "Secret"] == []
    (local_secret,) = [d for d in rendered["local"] if d["kind"] == "Secret"]
    assert local_secret["metadata"]["name"] == "redis-auth"
    assert re.fullmatch(r"[0-9a-f]{48}", base64.b64decode(
        local_secret["data"]["password"]).decode())
    ignored = (K8S / "overlays" / "local" / ".gitignore").read_text().split()
    assert "redis-password" in ignored


def test_every_setting_the_manifests_give_the_fleet_is_a_known_setting(rendered):
    # A misspelt variable would be ignored silently by the processes.
    for docs in rendered.values():
        config = _one(docs, "ConfigMap", "fleet-config")["data"]
        assert set(config) <= KNOWN_SETTINGS, set(config) - KNOWN_SETTINGS
        store = _one(docs, "ConfigMap", "media-store")["data"]
        assert set(store) <= KNOWN_SETTINGS, set(store) - KNOWN_SETTINGS
        for obj in (d for d in docs if d["kind"] in POD_KINDS and d["metadata"]["name"] != "redis"):
            for container in _pod_spec(obj)["containers"]:
                unknown = (set(_env(container)) - KNOWN_SETTINGS - {"SINCE_DAYS"}
                           - S3_CLIENT_VARIABLES)
                assert not unknown, (obj["metadata"]["name"], unknown)


def test_the_fleet_runs_quorum_queues_on_a_three_node_rabbitmq_cluster(rendered):
    for docs in rendered.values():
        assert _one(docs, "ConfigMap", "fleet-config")["data"]["QUEUE_TYPE"] == "quorum"
        cluster = _one(docs, "RabbitmqCluster", "rabbitmq")
        assert cluster["spec"]["replicas"] == 3
        urls = _env(_worker(docs))["RABBITMQ_URLS"]["value"].split(",")
        hosts = {re.search(r"@([^:/]+):5672/", url).group(1) for url in urls}
        assert hosts == {f"rabbitmq-server-{i}.rabbitmq-nodes" for i in range(3)}


def test_every_process_finds_redis_through_the_sentinels_of_the_statefulset(rendered):
    for docs in rendered.values():
        config = _one(docs, "ConfigMap", "fleet-config")["data"]
        redis = _one(docs, "StatefulSet", "redis")
        service = redis["spec"]["serviceName"]
        assert _one(docs, "Service", service)["spec"]["clusterIP"] == "None"
        sentinels = config["REDIS_SENTINELS"].split(",")
        assert sentinels == [f"redis-{i}.{service}:26379"
                             for i in range(redis["spec"]["replicas"])]
        assert int(config["REDIS_MIN_REPLICAS"]) >= 1
        for container in _pod_spec(redis)["containers"]:
            master = _env(container)["MASTER_NAME"]["valueFrom"]["configMapKeyRef"]
            assert (master["name"], master["key"]) == ("fleet-config", "REDIS_SENTINEL_MASTER")


# -- autoscaling, jobs, sink, monitoring ----------------------------------------------------

@pytest.mark.parametrize(("workers", "queues", "fewest"), [
    ("scraper", topology.WORK_QUEUES, 1),  # one stays: it also consumes expired_urls
    ("renderer", topology.RENDER_QUEUES, 0),
    ("downloader", topology.MEDIA_QUEUES, 0)])
def test_keda_scales_each_kind_of_worker_on_ready_plus_unacked_of_its_own_queues(
        rendered, workers, queues, fewest):
    every_queue = {q.name for q in topology.QUEUES} | {topology.hold_name(level)
                                                        for level in topology.HOLD_LEVELS_MS}
    assert set(queues) <= every_queue
    for docs in rendered.values():
        scaled = _one(docs, "ScaledObject", workers)["spec"]
        assert scaled["scaleTargetRef"] == {"name": workers}
        assert fewest == scaled["minReplicaCount"] < scaled["maxReplicaCount"]
        (trigger,) = scaled["triggers"]
        meta = trigger["metadata"]
        assert trigger["type"] == "rabbitmq"
        # Over HTTP the management API's `messages` is ready + unacked (AMQP sees ready only).
        assert (meta["protocol"], meta["mode"], meta["useRegex"], meta["operation"]) == (
            "http", "QueueLength", "true", "sum")
        assert "excludeUnacknowledged" not in meta and int(meta["value"]) > 0
        matched = {q for q in every_queue if re.fullmatch(meta["queueName"], q)}
        assert matched == set(queues)
        assert meta["host"] == "http://rabbitmq.scrape-fleet.svc:15672/"
        auth = _one(docs, "TriggerAuthentication", trigger["authenticationRef"]["name"])
        assert {(r["parameter"], r["name"], r["key"]) for r in auth["spec"]["secretTargetRef"]} == {
            ("username", "rabbitmq-default-user", "username"),
            ("password", "rabbitmq-default-user", "password")}
        assert "replicas" not in _one(docs, "Deployment", workers)["spec"], "KEDA owns it"


def test_the_producer_is_a_job_and_the_sitemap_producer_a_nightly_cronjob(rendered):
    for docs in rendered.values():
        job = _pod_spec(_one(docs, "Job", "producer"))
        (producer,) = job["containers"]
        assert producer["command"][:3] == ["python", "producer.py", "-f"]
        seeds_dir = next(m["mountPath"] for m in producer["volumeMounts"] if m["name"] == "seeds")
        assert producer["command"][3] == f"{seeds_dir}/seeds.txt"
        cron = _one(docs, "CronJob", "sitemap-producer")
        assert len(cron["spec"]["schedule"].split()) == 5
        assert cron["spec"]["concurrencyPolicy"] == "Forbid"
        (sitemap,) = _pod_spec(cron)["containers"]
        script = " ".join(sitemap["command"])
        assert "python sitemap_producer.py" in script and "--since" in script
        # `$$(` reaches the shell as `$(`: Kubernetes would otherwise try to expand it.
        assert '"$$(date -u -d "$SINCE_DAYS days ago" +%Y-%m-%d)"' in script


def test_the_sink_is_one_deployment_writing_to_a_persistent_volume_claim(rendered):
    for docs in rendered.values():
        sink = _one(docs, "Deployment", "sink")
        assert sink["spec"]["replicas"] == 1 and sink["spec"]["strategy"]["type"] == "Recreate"
        pod = _pod_spec(sink)
        (container,) = pod["containers"]
        assert container["command"] == ["python", "sink.py", "files"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mount = next(m for m in container["volumeMounts"]
                     if "persistentVolumeClaim" in volumes[m["name"]])
        claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
        _one(docs, "PersistentVolumeClaim", claim)
        assert mount["mountPath"] == _env(container)["SINK_DIR"]["value"]
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_prod_has_prometheus_scrape_the_scrapers_through_a_service_monitor(rendered):
    docs = rendered["prod"]
    monitor = _one(docs, "ServiceMonitor", "scraper")["spec"]
    services = [d for d in docs if d["kind"] == "Service" and all(
        d["metadata"].get("labels", {}).get(k) == v
        for k, v in monitor["selector"]["matchLabels"].items())]
    (service,) = services
    pod_labels = _one(docs, "Deployment", "scraper")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["endpoints"]} <= port_names



def test_the_control_plane_is_a_deployment_behind_a_service_probed_on_its_health_route(
        rendered):
    for overlay, docs in rendered.items():
        api = _one(docs, "Deployment", "api")
        (container,) = _pod_spec(api)["containers"]
        assert container["command"] == ["python", "api.py"]
        env = _env(container)
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        # The Service and the probes reach the pod's address; the default is loopback only.
        assert env["API_HOST"]["value"] == "0.0.0.0"
        assert int(env["API_PORT"]["value"]) == ports["http"]
        for probe in (container["readinessProbe"], container["livenessProbe"]):
            assert probe["httpGet"] == {"path": "/api/health", "port": "http"}
        service = _one(docs, "Service", "api")["spec"]
        assert service.get("type", "ClusterIP") == "ClusterIP", "published by nothing here"
        assert service["selector"].items() <= api["spec"]["template"]["metadata"][
            "labels"].items()
        (port,) = service["ports"]
        assert port["targetPort"] == "http"
        assert api["spec"]["replicas"] == {"local": 1, "prod": 2}[overlay]

# -- the render workers ---------------------------------------------------------------------

def test_render_workers_run_the_render_image_and_probe_the_pool_on_the_metrics_port(rendered):
    images = {"local": "scrape-fleet-render:local",
              "prod": "registry.example.com/scrape-fleet-render:1.0.0"}
    for overlay, docs in rendered.items():
        renderer = _one(docs, "Deployment", "renderer")
        pod = _pod_spec(renderer)
        worker = _worker(docs, "renderer")
        assert worker["command"] == ["python", "worker.py", "--render"]
        assert worker["image"] == images[overlay]
        assert worker["image"] != _worker(docs)["image"], "the plain image has no browser"
        env = _env(worker)
        assert env["METRICS_HOST"]["value"] == "0.0.0.0"
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        for probe in (worker["readinessProbe"], worker["livenessProbe"]):
            assert probe["httpGet"]["path"] == "/healthz"
            assert ports[probe["httpGet"]["port"]] == int(env["METRICS_PORT"]["value"])
        assert pod["terminationGracePeriodSeconds"] >= SHUTDOWN_GRACE_S + 10
        # Chromium's exited processes are reaped by the pod's PID 1 (compose: init: true).
        assert pod["shareProcessNamespace"] is True
        assert "replicas" not in renderer["spec"], "KEDA owns it"


def test_render_workers_keep_chromiums_shared_memory_in_memory_backed_volumes(rendered):
    for docs in rendered.values():
        pod = _pod_spec(_one(docs, "Deployment", "renderer"))
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in _worker(docs, "renderer")["volumeMounts"]}
        for path in ("/tmp", "/dev/shm"):
            assert volumes[mounts[path]]["emptyDir"]["medium"] == "Memory", path
        # Chromium runs with --disable-dev-shm-usage: its shared memory is in /tmp.
        assert _mib(volumes[mounts["/tmp"]]["emptyDir"]["sizeLimit"]) >= 256


def test_render_worker_memory_is_sized_from_its_browsers(rendered):
    defaults = {knob.env: knob.default for knob in KNOBS}
    worker_mib = 150  # the worker and Playwright's driver
    for docs in rendered.values():
        worker = _worker(docs, "renderer")
        browsers = int(_env(worker)["RENDER_THREADS"]["value"])
        # A browser measured at 323-366 MiB PSS (NOTES #73), recycled past
        # RENDER_MAX_BROWSER_MB: the request holds the first, the limit the second.
        assert _mib(worker["resources"]["requests"]["memory"]) >= browsers * 400 + worker_mib
        assert _mib(worker["resources"]["limits"]["memory"]) >= (
            browsers * int(defaults["RENDER_MAX_BROWSER_MB"]) + worker_mib)
        # Renders are CPU-bound: a core per browser.
        assert float(worker["resources"]["requests"]["cpu"]) >= browsers


# -- the Redis pods' start script ------------------------------------------------------------

START_SH = K8S / "base" / "redis" / "start.sh"
DOMAIN = "redis-headless.fleet-ns.svc"


def _start(tmp_path: Path, role: str, hostname: str, sentinel_answer: str = "") -> str:
    """Run start.sh with stand-ins for redis-cli (answering ``sentinel_answer``) and for
    redis-server/redis-sentinel (which only exit): the config it writes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    conf = Path(tempfile.mkdtemp(prefix=f"conf-{role}-", dir=tmp_path))
    (bin_dir / "redis-cli").write_text(f"#!/bin/sh\nprintf '%s\\n' '{sentinel_answer}'\n")
    for name in ("redis-server", "redis-sentinel"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 0\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOSTNAME": hostname, "CONF_DIR": str(conf),
           "POD_NAMESPACE": "fleet-ns", "MASTER_NAME": "fleet",
           "REDISCLI_AUTH": "s3cret-pw", "REDIS_MAXMEMORY": "64mb"}
    subprocess.run(["sh", str(START_SH), role], env=env, check=True, timeout=30,
                   stdin=subprocess.DEVNULL)
    return (conf / ("redis.conf" if role == "redis" else "sentinel.conf")).read_text()


def test_pod_zero_starts_as_the_primary_when_no_sentinel_answers(tmp_path):
    assert "replicaof" not in _start(tmp_path, "redis", "redis-0")
    assert f"replicaof redis-0.{DOMAIN} 6379" in _start(tmp_path, "redis", "redis-1")
    assert f"sentinel monitor fleet redis-0.{DOMAIN} 6379 2" in _start(
        tmp_path, "sentinel", "redis-2")


def test_a_restarted_pod_follows_the_primary_the_sentinels_name(tmp_path):
    conf = _start(tmp_path, "redis", "redis-0", sentinel_answer=f"redis-2.{DOMAIN}")
    assert f"replicaof redis-2.{DOMAIN} 6379" in conf
    assert f"replica-announce-ip redis-0.{DOMAIN}" in conf
    # An error reply is not an address.
    assert "replicaof" not in _start(tmp_path, "redis", "redis-0",
                                     sentinel_answer="NOAUTH Authentication required.")


@pytest.mark.integration
def test_real_redis_and_sentinel_accept_the_generated_configs(tmp_path):
    redis_server = require_tool("redis-server")
    redis_cli = require_tool("redis-cli")
    port, sentinel_port = _free_port(), _free_port()
    primary = _start(tmp_path, "redis", "redis-0").replace("port 6379", f"port {port}")
    primary = primary.replace("dir /data", f"dir {tmp_path}")
    sentinel = _start(tmp_path, "sentinel", "redis-0").replace(
        "port 26379", f"port {sentinel_port}").replace(f"redis-0.{DOMAIN} 6379",
                                                      f"127.0.0.1 {port}")
    sentinel = sentinel.replace(f"announce-ip redis-0.{DOMAIN}", "announce-ip 127.0.0.1")
    (tmp_path / "primary.conf").write_text(primary + "bind 127.0.0.1\n")
    (tmp_path / "sentinel.conf").write_text(sentinel + "bind 127.0.0.1\n")
    procs = [subprocess.Popen([redis_server, str(tmp_path / "primary.conf")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT),
             subprocess.Popen([redis_server, str(tmp_path / "sentinel.conf"), "--sentinel"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    try:
        env = {"REDISCLI_AUTH": "s3cret-pw", "PATH": "/usr/bin:/bin"}

        def ask(*args: str) -> str:
            return subprocess.run([redis_cli, "-h", "127.0.0.1", *args], env=env, timeout=10,
                                  capture_output=True, text=True).stdout

        assert _eventually(lambda: ask("-p", str(port), "ping").strip() == "PONG")
        assert ask("-p", str(port), "config", "get", "maxmemory").split()[1] == str(64 * 2**20)
        assert _eventually(lambda: ask("-p", str(sentinel_port), "sentinel",
                                       "get-master-addr-by-name", "fleet").split()
                           == ["127.0.0.1", str(port)])
        # Without the password neither answers.
        no_auth = subprocess.run([redis_cli, "-h", "127.0.0.1", "-p", str(port), "ping"],
                                 env={"PATH": "/usr/bin:/bin"}, timeout=10,
                                 capture_output=True, text=True).stdout
        assert "NOAUTH" in no_auth
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _eventually(predicate: Any, timeout_s: float = 10.0) -> bool:
    from tests.helpers import wait_for

    return wait_for(predicate, timeout_s=timeout_s, step_s=0.1)


# -- network policies -------------------------------------------------------------------------

PRIVATE_V4 = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16")
PRIVATE_V6 = ("fc00::/7", "fe80::/10")


def _policy(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    policy = _one(docs, "NetworkPolicy", name)
    assert policy["metadata"]["namespace"] == "scrape-fleet"
    return policy["spec"]


def _ports(rule: dict[str, Any]) -> set[tuple[int, str]]:
    return {(p["port"], p.get("protocol", "TCP")) for p in rule.get("ports", [])}


def _pods_of(peer: dict[str, Any]) -> dict[str, str]:
    return peer.get("podSelector", {}).get("matchLabels", {})


def _namespace_of(peer: dict[str, Any]) -> str | None:
    return peer.get("namespaceSelector", {}).get("matchLabels", {}).get(
        "kubernetes.io/metadata.name")


def _who_reaches(spec: dict[str, Any], port: int) -> list[dict[str, Any]]:
    """The peers an Ingress policy lets reach ``port`` (a rule with no ports: any port)."""
    return [peer for rule in spec.get("ingress", [])
            if not rule.get("ports") or (port, "TCP") in _ports(rule)
            for peer in rule.get("from", [{}])]


def test_every_overlay_has_the_four_network_policies(rendered):
    for docs in rendered.values():
        names = {d["metadata"]["name"] for d in docs if d["kind"] == "NetworkPolicy"}
        assert names == {"redis", "rabbitmq", "scraper-metrics", "scraper-egress",
                         "renderer-metrics", "renderer-egress", "downloader-metrics",
                         "downloader-egress"}


def test_rabbitmq_takes_amqp_from_the_fleets_pods_and_its_ui_port_from_keda_alone(rendered):
    for docs in rendered.values():
        spec = _policy(docs, "rabbitmq")
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rabbitmq"}
        assert spec["policyTypes"] == ["Ingress"]
        fleet = {"app.kubernetes.io/part-of": "scrape-fleet"}
        assert [_pods_of(p) for p in _who_reaches(spec, 5672)] == [fleet]
        assert all("namespaceSelector" not in p and "ipBlock" not in p
                   for p in _who_reaches(spec, 5672))
        # The management API: no pod of any namespace but KEDA's operator (autoscaling.yaml).
        (keda,) = _who_reaches(spec, 15672)
        assert _namespace_of(keda) == "keda" and "podSelector" not in keda
        for port in (4369, 25672):  # clustering: the nodes among themselves only
            assert [_pods_of(p) for p in _who_reaches(spec, port)] == [
                {"app.kubernetes.io/name": "rabbitmq"}]
        opened = {port for rule in spec["ingress"] for port, _ in _ports(rule)}
        assert opened == {5672, 15672, 4369, 25672}
        trigger = _one(docs, "ScaledObject", "scraper")["spec"]["triggers"][0]["metadata"]
        assert trigger["host"].endswith(":15672/")  # why KEDA is let in


@pytest.mark.parametrize("workers", ["scraper", "renderer", "downloader"])
def test_worker_metrics_are_reachable_from_the_monitoring_namespace_only(rendered, workers):
    for docs in rendered.values():
        spec = _policy(docs, f"{workers}-metrics")
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": workers}
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert _ports(rule) == {(int(_env(_worker(docs, workers))["METRICS_PORT"]["value"]),
                                 "TCP")}
        (peer,) = rule["from"]
        assert _namespace_of(peer) == "monitoring" and set(peer) == {"namespaceSelector"}


@pytest.mark.parametrize("workers", ["scraper", "renderer", "downloader"])
def test_workers_reach_dns_the_fleet_and_public_addresses_but_no_private_range(rendered,
                                                                               workers):
    for docs in rendered.values():
        spec = _policy(docs, f"{workers}-egress")
        assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": workers}
        assert spec["policyTypes"] == ["Egress"]
        blocks = [peer["ipBlock"] for rule in spec["egress"] for peer in rule["to"]
                  if "ipBlock" in peer]
        by_cidr = {block["cidr"]: set(block.get("except", [])) for block in blocks}
        assert set(by_cidr) == {"0.0.0.0/0", "::/0"}  # the public internet, on any port
        assert set(PRIVATE_V4) <= by_cidr["0.0.0.0/0"] and set(PRIVATE_V6) <= by_cidr["::/0"]
        ip_rules = [rule for rule in spec["egress"] if any("ipBlock" in p for p in rule["to"])]
        assert all(not rule.get("ports") and all("ipBlock" in p for p in rule["to"])
                   for rule in ip_rules)
        # Everything else is a pod selector: DNS, RabbitMQ's AMQP, Redis and its sentinels; the
        # download workers' object store is a namespace's S3 port (the next test).
        allowed = {(tuple(sorted(_pods_of(peer).items())), port)
                   for rule in spec["egress"] for peer in rule["to"] if "ipBlock" not in peer
                   and _namespace_of(peer) != "minio" for port in _ports(rule)}
        assert allowed == {
            ((("k8s-app", "kube-dns"),), (53, "UDP")), ((("k8s-app", "kube-dns"),), (53, "TCP")),
            ((("app.kubernetes.io/name", "rabbitmq"),), (5672, "TCP")),
            ((("app.kubernetes.io/name", "redis"),), (6379, "TCP")),
            ((("app.kubernetes.io/name", "redis"),), (26379, "TCP"))}
        dns = [peer for rule in spec["egress"] for peer in rule["to"]
               if _pods_of(peer) == {"k8s-app": "kube-dns"}]
        assert all(peer.get("namespaceSelector") == {} for peer in dns)  # kube-system's pods


# -- the download workers ---------------------------------------------------------------------

def test_download_workers_run_the_plain_image_on_the_media_queues_with_a_disk_spool(rendered):
    for docs in rendered.values():
        downloader = _one(docs, "Deployment", "downloader")
        pod = _pod_spec(downloader)
        worker = _worker(docs, "downloader")
        assert worker["command"] == ["python", "worker.py", "--media"]
        assert worker["image"] == _worker(docs)["image"], "no browser: the scrapers' image"
        env = _env(worker)
        ports = {p["name"]: p["containerPort"] for p in worker["ports"]}
        for probe in (worker["readinessProbe"], worker["livenessProbe"]):
            assert probe["httpGet"]["path"] == "/healthz"
            assert ports[probe["httpGet"]["port"]] == int(env["METRICS_PORT"]["value"])
        assert env["METRICS_HOST"]["value"] == "0.0.0.0"
        assert pod["terminationGracePeriodSeconds"] >= SHUTDOWN_GRACE_S + 10
        assert "replicas" not in downloader["spec"], "KEDA owns it"
        # Assets stream to the node's disk, not to memory: the spool is a plain emptyDir as
        # large as WORKER_CONCURRENCY downloads at the largest cap.
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
        spool = volumes[mounts[env["MEDIA_SPOOL_DIR"]["value"]]]["emptyDir"]
        assert "medium" not in spool
        defaults = {knob.env: knob.default for knob in KNOBS}
        largest_mib = max(_size_mib(cap.split("=")[1])
                          for cap in defaults["MEDIA_MAX_BYTES"].split(","))
        assert _mib(spool["sizeLimit"]) >= int(env["WORKER_CONCURRENCY"]["value"]) * largest_mib


def _size_mib(size: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(MB|GB)", size).groups()
    return int(number) * (10**6 if unit == "MB" else 10**9) / 2**20


def test_download_workers_find_the_store_in_a_config_map_and_its_keys_in_a_secret(rendered):
    for docs in rendered.values():
        worker = _worker(docs, "downloader")
        sources = [s["configMapRef"]["name"] for s in worker["envFrom"]]
        assert sources == ["fleet-config", "media-store"]
        store = _one(docs, "ConfigMap", "media-store")["data"]
        assert store["MEDIA_STORE"].startswith("s3://") and store["S3_ENDPOINT_URL"]
        keys = {name: var["valueFrom"]["secretKeyRef"] for name, var in _env(worker).items()
                if name in S3_CLIENT_VARIABLES}
        assert {(name, ref["name"]) for name, ref in keys.items()} == {
            ("AWS_ACCESS_KEY_ID", "media-store-credentials"),
            ("AWS_SECRET_ACCESS_KEY", "media-store-credentials")}
        # Nobody else holds the store's keys.
        for obj in (d for d in docs if d["kind"] in POD_KINDS and d["metadata"]["name"]
                    != "downloader"):
            for container in _pod_spec(obj)["containers"]:
                assert not S3_CLIENT_VARIABLES & set(_env(container)), obj["metadata"]["name"]


def test_download_workers_reach_the_object_store_namespace_on_its_s3_port_only(rendered):
    for docs in rendered.values():
        spec = _policy(docs, "downloader-egress")
        store = [(peer, rule) for rule in spec["egress"] for peer in rule["to"]
                 if _namespace_of(peer) == "minio"]
        assert len(store) == 1
        peer, rule = store[0]
        assert set(peer) == {"namespaceSelector"} and _ports(rule) == {(9000, "TCP")}
        endpoint = _one(docs, "ConfigMap", "media-store")["data"]["S3_ENDPOINT_URL"]
        assert re.fullmatch(r"http://[a-z0-9-]+\.minio\.svc:9000", endpoint)
        for workers in ("scraper", "renderer"):
            assert not any(_namespace_of(p) == "minio" for rule in _policy(
                docs, f"{workers}-egress")["egress"] for p in rule["to"]), workers
