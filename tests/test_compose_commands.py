"""The Docker commands the docs show (README.md and every page under docs/, deployment.md above
all), checked as users will type them.

Every ``docker compose ...`` command (in code blocks and inline code) is read the way Compose v2
reads it: global options, the subcommand and its options, the services, and for ``run`` the
command the container will really execute (the service's entrypoint, else the image's, followed
by the arguments typed, else the service's command, else the image's CMD). It is checked
against the configuration Compose builds from docker-compose.yml and docker-compose.override.yml
(rendered by Debian's docker-compose, used to parse and merge only). A command that names a
missing service or profile, or that runs something other than one of our scripts once, fails.

``docker stack deploy -c docker-compose.yml`` is checked with ``docker stack config``, the
loader and schema of ``docker stack deploy`` itself, where a Docker CLI has it (Docker 25+);
the rules it enforces that matter here are also checked on the file directly, always. What
neither can show without a swarm: scheduling, the overlay network, the ingress.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.core.config import load_settings
from common.core.errors import ConfigError
from common.core.knobs import KNOBS
from tests.helpers import REPO_ROOT, compose_config, env_example

README = REPO_ROOT / "README.md"
#: Where the Docker commands are shown: README, then every page of the docs site.
PAGES = (README, *sorted((REPO_ROOT / "docs").rglob("*.md")))
APP_IMAGE = "scrape-fleet:local"

#: Compose v2 options: global, and per subcommand (options taking a value, flags).
GLOBAL_VALUE_OPTS = {"--profile", "-f", "--file", "-p", "--project-name", "--env-file",
                     "--project-directory", "--ansi", "--progress", "--parallel"}
SUBCOMMANDS: dict[str, tuple[set[str], set[str]]] = {
    "up": ({"--scale", "-t", "--timeout", "--wait-timeout", "--pull", "--exit-code-from",
            "--attach", "--no-attach"},
           {"-d", "--detach", "--build", "--no-build", "--force-recreate", "--no-recreate",
            "--no-deps", "--remove-orphans", "--wait", "--abort-on-container-exit", "-V",
            "--quiet-pull", "--no-start"}),
    "run": ({"-e", "--env", "--entrypoint", "-l", "--label", "--name", "-p", "--publish", "-u",
             "--user", "-v", "--volume", "-w", "--workdir", "--pull"},
            {"--rm", "-d", "--detach", "-T", "--no-TTY", "-i", "--interactive", "--no-deps",
             "--service-ports", "--build", "--remove-orphans", "--quiet-pull"}),
    "exec": ({"-e", "--env", "-u", "--user", "-w", "--workdir", "--index"},
             {"-d", "--detach", "-T", "--no-TTY", "--privileged", "-i", "-t"}),
    "logs": ({"-n", "--tail", "--since", "--until", "--index"},
             {"-f", "--follow", "-t", "--timestamps", "--no-color", "--no-log-prefix"}),
    "down": ({"-t", "--timeout", "--rmi"}, {"-v", "--volumes", "--remove-orphans"}),
    "ps": (set(), {"-a", "--all", "-q", "--quiet", "--services"}),
    "build": ({"--build-arg"}, {"--no-cache", "--pull", "-q", "--quiet"}),
    "pull": (set(), {"-q", "--quiet", "--ignore-pull-failures"}),
    "stop": ({"-t", "--timeout"}, set()),
    "restart": ({"-t", "--timeout"}, {"--no-deps"}),
    "config": (set(), {"-q", "--quiet", "--services", "--profiles", "--volumes"}),
}


# -- reading the docs --------------------------------------------------------------------------

def docs_text() -> str:
    """README.md and the docs pages, one after the other."""
    return "\n\n".join(page.read_text(encoding="utf-8") for page in PAGES)


def readme_commands(text: str) -> list[list[str]]:
    """Every command line in ``text``'s code blocks and inline code, split like a shell."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    lines = [line for block in blocks for line in block.replace("\\\n", " ").splitlines()]
    prose = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    lines += re.findall(r"`([^`\n]+)`", prose)
    commands = []
    for line in lines:
        for part in re.split(r"&&|;|\|", line):
            try:
                tokens = shlex.split(part, comments=True)
            except ValueError:
                continue
            if tokens:
                commands.append(tokens)
    return commands


def compose_commands(text: str) -> list[list[str]]:
    return [tokens[2:] for tokens in readme_commands(text)
            if tokens[:2] == ["docker", "compose"] and len(tokens) > 2]


# -- Compose v2's reading of a command ---------------------------------------------------------

def _take_options(args: list[str], value_opts: set[str], flags: set[str],
                  stop_at_positional: bool) -> tuple[dict[str, list[str]], list[str]]:
    options: dict[str, list[str]] = {}
    positionals: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if positionals and stop_at_positional:
            positionals.append(arg)
        elif arg.startswith("-") and arg != "-":
            name, eq, value = arg.partition("=")
            if name in value_opts:
                if not eq:
                    i += 1
                    value = args[i]
                options.setdefault(name, []).append(value)
            elif name in flags and not eq:
                options.setdefault(name, []).append("")
            else:
                raise AssertionError(f"unknown option {arg!r}: teach {__name__} or fix the docs")
        else:
            positionals.append(arg)
        i += 1
    return options, positionals


def parse(args: list[str]) -> dict[str, Any]:
    """One `docker compose` command line (without `docker compose`), as Compose v2 reads it."""
    global_opts, rest = {}, list(args)
    while rest and rest[0].startswith("-"):
        name, eq, value = rest.pop(0).partition("=")
        assert name in GLOBAL_VALUE_OPTS, f"unknown global option {name!r}"
        global_opts.setdefault(name, []).append(value if eq else rest.pop(0))
    assert rest, f"no subcommand in {args}"
    subcommand = rest.pop(0)
    assert subcommand in SUBCOMMANDS, f"unknown subcommand {subcommand!r}: teach {__name__}"
    value_opts, flags = SUBCOMMANDS[subcommand]
    # `run` and `exec` stop at the service: what follows is the container's command.
    options, positionals = _take_options(rest, value_opts, flags,
                                         stop_at_positional=subcommand in {"run", "exec"})
    services, command = positionals, []
    if subcommand in {"run", "exec"}:
        services, command = positionals[:1], positionals[1:]
        assert services, f"`{subcommand}` needs a service: {args}"
    return {"global": global_opts, "subcommand": subcommand, "options": options,
            "services": services, "command": command}


def _dockerfile() -> tuple[list[str], list[str]]:
    """The image's ENTRYPOINT and CMD (exec form)."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("ENTRYPOINT "):
            entrypoint = yaml.safe_load(line.split(None, 1)[1])
        elif line.startswith("CMD "):
            cmd = yaml.safe_load(line.split(None, 1)[1])
    return entrypoint, cmd


def container_argv(service: dict[str, Any], typed: list[str],
                   entrypoint_override: str | None = None) -> list[str]:
    """What `docker compose run SERVICE TYPED...` executes in the container."""
    image_entrypoint, image_cmd = _dockerfile()
    if entrypoint_override is not None:
        entrypoint = shlex.split(entrypoint_override)
    else:
        entrypoint = service.get("entrypoint") or []
    # Docker drops the image's CMD when the entrypoint is set by the service or the command.
    entrypoint_set = entrypoint_override is not None or "entrypoint" in service
    if not entrypoint_set:
        entrypoint = image_entrypoint
    command = typed or service.get("command") or ([] if entrypoint_set else image_cmd)
    return [*entrypoint, *command]


def runs_one_of_our_scripts(argv: list[str]) -> str | None:
    """None when ``argv`` is `python SCRIPT.py ARGS` with SCRIPT.py in the repository and no
    second interpreter or script; else what is wrong."""
    if len(argv) < 2 or argv[0] != "python" or not argv[1].endswith(".py"):
        return f"not `python SCRIPT.py ...`: {argv}"
    if not (REPO_ROOT / argv[1]).is_file():
        return f"no script {argv[1]}: {argv}"
    if "python" in argv[2:] or any((REPO_ROOT / a).is_file() for a in argv[2:]
                                   if a.endswith(".py")):
        return f"runs a second interpreter or script: {argv}"
    return None


def check(command: dict[str, Any], config: dict[str, Any]) -> list[str]:
    """What is wrong with one parsed command against the merged compose configuration."""
    services = config["services"]
    problems = []
    known_profiles = {p for s in services.values() for p in s.get("profiles", [])}
    for profile in command["global"].get("--profile", []):
        if profile not in known_profiles:
            problems.append(f"no profile {profile!r}")
    for file in command["global"].get("-f", []) + command["global"].get("--file", []):
        if not (REPO_ROOT / file).is_file():
            problems.append(f"no file {file}")
    for name in command["services"]:
        if name not in services:
            problems.append(f"no service {name!r}")
    for scale in command["options"].get("--scale", []):
        if scale.partition("=")[0] not in services:
            problems.append(f"--scale names no service: {scale}")
    if problems:
        return problems
    if command["subcommand"] == "up" and not any(
            s.startswith("scraper=") for s in command["options"].get("--scale", [])):
        # Compose v2 brings every service to deploy.replicas on `up` (else to one).
        if not services["scraper"].get("deploy", {}).get("replicas"):
            problems.append("`up` would reset the scrapers to one: no deploy.replicas")
    if command["subcommand"] == "run":
        service = services[command["services"][0]]
        if service.get("image") == APP_IMAGE:
            entrypoint = command["options"].get("--entrypoint", [None])[-1]
            wrong = runs_one_of_our_scripts(container_argv(service, command["command"],
                                                           entrypoint))
            if wrong:
                problems.append(wrong)
    return problems


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    result = compose_config(tmp_path_factory.mktemp("compose"), env_example())
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_the_docs_show_the_compose_commands_a_user_needs():
    subcommands = {parse(args)["subcommand"] for args in compose_commands(docs_text())}
    assert {"up", "run", "logs"} <= subcommands


def test_every_compose_command_in_the_docs_works_as_written(config):
    problems = {}
    for args in compose_commands(docs_text()):
        wrong = check(parse(args), config)
        if wrong:
            problems[shlex.join(["docker", "compose", *args])] = wrong
    assert problems == {}


def test_the_docs_show_no_compose_v1_command():
    v1 = [t for t in readme_commands(docs_text())
          if t[0] == "docker-compose" and len(t) > 1]
    assert v1 == []


def test_the_check_catches_the_mistakes_users_met(config):
    doubled = "run --rm producer python producer.py https://example.com/"
    assert any("second interpreter" in p for p in check(parse(doubled.split()), config))
    stats_via_producer = "run --rm producer python stats.py"
    assert check(parse(stats_via_producer.split()), config)
    assert check(parse("--profile monitorin up -d".split()), config) == [
        "no profile 'monitorin'"]
    assert check(parse("logs -f scrapers".split()), config) == ["no service 'scrapers'"]
    reset = {**config["services"]["scraper"], "deploy": {}}
    assert check(parse("--profile monitoring up -d".split()),
                 {**config, "services": {**config["services"], "scraper": reset}})
    with pytest.raises(AssertionError, match="unknown option"):
        parse("up --detatch".split())


def test_the_tools_run_their_script_with_what_follows_the_service_name(config):
    services = config["services"]
    assert container_argv(services["producer"], ["https://a.example/"]) == [
        "python", "producer.py", "https://a.example/"]
    assert container_argv(services["sitemap_producer"], ["https://a.example/"])[:2] == [
        "python", "sitemap_producer.py"]
    assert container_argv(services["tools"], ["python", "dlq.py", "list"]) == [
        "python", "dlq.py", "list"]
    assert container_argv(services["tools"], []) == ["python", "stats.py"]
    assert container_argv(services["scraper"], []) == ["python", "worker.py"]



# -- Render workers: their own image, their own profile ----------------------------------------

def _stages() -> dict[str, list[str]]:
    """The Dockerfile's stages by name, each its lines without comments, in order."""
    stages: dict[str, list[str]] = {}
    current: list[str] = []
    for line in (REPO_ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            current = stages.setdefault(line.split()[-1], [])
        if not line.lstrip().startswith("#"):
            current.append(line)
    return stages


def _mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)([MG])", str(quantity)).groups()
    return int(number) * (1024 if unit == "G" else 1)


def test_the_plain_image_is_the_default_target_and_only_the_render_image_has_a_browser():
    stages = _stages()
    assert list(stages)[-1] == "scraper", "a build without --target must give the plain image"
    renderer = "\n".join(stages["renderer"])
    assert stages["renderer"][0] == "FROM runtime AS renderer"
    assert re.search(r"apt-get install -y --no-install-recommends chromium\b", renderer)
    # The Node binary in Playwright's wheel links libatomic (a compose-e2e run found it missing).
    assert "libatomic1" in renderer
    assert "-r requirements-render.lock" in renderer
    assert "ENV BROWSER_EXECUTABLE=/usr/bin/chromium" in renderer
    assert "playwright install" not in renderer, "no browser download: Debian's chromium"
    assert renderer.splitlines()[-1] == 'CMD ["python", "worker.py", "--render"]'
    assert "USER 10001:10001" in renderer
    for plain in ("runtime", "scraper"):
        text = "\n".join(stages[plain])
        assert "chromium" not in text and "render" not in text, plain
    assert "playwright" not in (REPO_ROOT / "requirements.lock").read_text()


def test_render_workers_start_with_the_render_profile_from_the_render_image(config):
    services = config["services"]
    renderer, build = services["renderer"], services["render-image"]
    assert renderer["profiles"] == ["render"] == build["profiles"]
    assert build["build"]["target"] == "renderer" and build["image"] == renderer["image"]
    assert container_argv(renderer, []) == ["python", "worker.py", "--render"]
    assert renderer["init"] is True, "Chromium's exited children must be reaped"
    assert {name: dep["condition"] for name, dep in renderer["depends_on"].items()} == {
        "rabbitmq": "service_healthy", "redis": "service_healthy"}
    assert "http://127.0.0.1:9100/healthz" in " ".join(renderer["healthcheck"]["test"])
    assert int(renderer["deploy"]["replicas"]) == 1
    # Nothing outside the profile runs or builds the render image: `up` stays light.
    for name, service in services.items():
        if service.get("image") == renderer["image"]:
            assert service.get("profiles") == ["render"], name


def test_render_worker_memory_is_sized_from_the_browsers_it_runs(config):
    defaults = {knob.env: knob.default for knob in KNOBS}
    browsers = int(defaults["RENDER_THREADS"])
    resources = config["services"]["renderer"]["deploy"]["resources"]
    worker_mib = 150  # the worker and Playwright's driver
    # A browser measured at 323-366 MiB PSS (NOTES #73), recycled past RENDER_MAX_BROWSER_MB.
    assert _mib(resources["reservations"]["memory"]) >= browsers * 400 + worker_mib
    assert _mib(resources["limits"]["memory"]) >= (
        browsers * int(defaults["RENDER_MAX_BROWSER_MB"]) + worker_mib)
    tmp = next(v for v in config["services"]["renderer"]["volumes"]
               if isinstance(v, dict) and v["target"] == "/tmp")
    assert tmp["tmpfs"]["size"] >= 256 * 2**20, "Chromium's shared memory lives in /tmp"

# -- Download workers and MinIO: the media profile ----------------------------------------------

MEDIA_PROFILE_SERVICES = {"downloader", "minio"}


def test_download_workers_start_with_the_media_profile_after_minio(config):
    services = config["services"]
    downloader = services["downloader"]
    assert downloader["profiles"] == ["media"]
    assert downloader["image"] == services["scraper"]["image"] == APP_IMAGE
    assert container_argv(downloader, []) == ["python", "worker.py", "--media"]
    assert {name: dep["condition"] for name, dep in downloader["depends_on"].items()} == {
        "rabbitmq": "service_healthy", "redis": "service_healthy", "minio": "service_healthy"}
    assert "http://127.0.0.1:9100/healthz" in " ".join(downloader["healthcheck"]["test"])
    assert int(downloader["deploy"]["replicas"]) == 1
    assert "ports" not in downloader
    # Assets stream to disk, on a volume of the container's own, not to the /tmp tmpfs.
    spool = downloader["environment"]["MEDIA_SPOOL_DIR"]
    (volume,) = [v for v in downloader["volumes"]
                 if isinstance(v, dict) and v["target"] == spool]
    assert volume["type"] == "volume" and "source" not in volume


def test_the_plain_image_gives_the_spool_directory_to_the_app_user():
    # A new volume takes the owner of the image's directory it is mounted on: without it the
    # download workers (uid 10001) could not write a spool file there.
    lines = " ".join(_stages()["scraper"])
    mkdir = re.search(r"mkdir -p ([^&]+)&&\s*chown 10001:10001 ([^&]+)&&", lines)
    assert mkdir, "the scraper stage makes and hands over its data directories"
    assert "/data/spool" in mkdir.group(1).split() and "/data/spool" in mkdir.group(2).split()


def test_a_plain_up_starts_no_download_worker_and_no_minio(config):
    for name, service in config["services"].items():
        if name in MEDIA_PROFILE_SERVICES or "minio" in service.get("image", ""):
            assert service.get("profiles") == ["media"], name
    assert check(parse("--profile media up -d".split()), config) == []
    assert check(parse("--profile media up -d --scale downloader=3".split()), config) == []


def test_minio_is_pinned_published_on_loopback_only_and_has_no_default_password(
        config, tmp_path):
    minio = config["services"]["minio"]
    assert re.fullmatch(r"minio/minio:RELEASE\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\dZ",
                        minio["image"])
    assert minio["command"] == ["server", "/data", "--console-address", ":9001"]
    assert "minio-data:/data:rw" in minio["volumes"]
    assert minio["healthcheck"]["test"] == ["CMD", "mc", "ready", "local"]
    assert minio["ports"] and all(p.startswith("127.0.0.1:") for p in minio["ports"])
    assert {p.rsplit(":", 1)[1] for p in minio["ports"]} == {"9000/tcp", "9001/tcp"}
    # The password comes from .env or compose refuses: there is no default to fall back on.
    override = (REPO_ROOT / "docker-compose.override.yml").read_text()
    uses = re.findall(r"\$\{(MINIO_ROOT_(?:USER|PASSWORD))([^}]*)\}", override)
    assert uses and all(rest.startswith(":?") for _, rest in uses), uses
    without = {k: v for k, v in env_example().items() if k != "MINIO_ROOT_PASSWORD"}
    refused = compose_config(tmp_path, without, "media")
    assert refused.returncode != 0 and "MINIO_ROOT_PASSWORD" in refused.stderr


# -- Swarm: docker-compose.yml alone -------------------------------------------------------------

def stack_deploy_files(text: str) -> list[list[str]]:
    """The compose files of every `docker stack deploy` command in ``text``."""
    found = []
    for tokens in readme_commands(text):
        while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
            tokens = tokens[1:]  # VAR=value before the command
        if tokens[:3] == ["docker", "stack", "deploy"] and len(tokens) > 3:
            files = [tokens[i + 1] for i, t in enumerate(tokens)
                     if t in {"-c", "--compose-file"}]
            found.append(files)
    return found


def test_the_docs_deploy_the_stack_from_docker_compose_yml_and_swarm_files_only():
    deploys = stack_deploy_files(docs_text())
    assert deploys and all(files[0] == "docker-compose.yml" for files in deploys)
    extra = {file for files in deploys for file in files[1:]}
    assert extra and all(f.startswith("deploy/swarm/") for f in extra), extra
    assert all((REPO_ROOT / file).is_file() for file in extra)


def test_the_swarm_file_uses_only_what_docker_stack_deploy_accepts(tmp_path):
    base = yaml.safe_load((REPO_ROOT / "docker-compose.yml").read_text())
    for name, service in base["services"].items():
        # docker stack deploy refuses these (or, for ports, would publish on every address).
        assert not {"profiles", "mem_limit", "extends", "tmpfs", "ports"} & set(service), name
        assert isinstance(service.get("depends_on", []), list), name
        assert service["deploy"]["restart_policy"]["condition"] == "any", name
        assert service["deploy"]["resources"]["limits"]["memory"], name
    scraper = base["services"]["scraper"]["deploy"]
    assert {"replicas", "update_config", "rollback_config"} <= set(scraper)
    for name in ("rabbitmq", "redis", "sink"):
        constraints = base["services"][name]["deploy"]["placement"]["constraints"]
        assert constraints == ["node.labels.fleet.data == true"], name
    result = compose_config(tmp_path, env_example(), files=("docker-compose.yml",))
    assert result.returncode == 0, result.stderr
    # The download workers are in the stack, none running unless MEDIA_REPLICAS says so (as
    # RENDER_REPLICAS); MinIO is compose's only (a Swarm stack names its own S3).
    swarm = yaml.safe_load(result.stdout)["services"]
    assert (swarm["downloader"]["deploy"]["replicas"], swarm["renderer"]["deploy"]["replicas"]) \
        == (0, 0)
    assert "minio" not in swarm
    assert swarm["downloader"]["command"] == ["python", "worker.py", "--media"]


def _docker_with_stack_config() -> str:
    candidates = [shutil.which("docker"), "/usr/local/bin/docker", "/usr/bin/docker"]
    for candidate in dict.fromkeys(c for c in candidates if c and Path(c).is_file()):
        result = subprocess.run([candidate, "stack", "config", "--help"], capture_output=True,
                                text=True, timeout=30, stdin=subprocess.DEVNULL)
        if result.returncode == 0 and "--compose-file" in result.stdout:
            return candidate
    # Not installable here: no Debian package has a Docker CLI with `stack config` (25+).
    pytest.skip("no Docker CLI with `docker stack config`; the static check above still ran")


def test_docker_stack_deploy_reads_the_compose_file(tmp_path):
    docker = _docker_with_stack_config()
    # As docs/deployment.md: `set -a; . ./.env; set +a` before `docker stack deploy`.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env_example()}
    result = subprocess.run([docker, "stack", "config", "-c", "docker-compose.yml"],
                            cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    stack = yaml.safe_load(result.stdout)
    assert set(stack["services"]) == {"rabbitmq", "redis", "scraper", "sink", "scheduler",
                                     "api", "renderer", "downloader"}
    assert stack["services"]["downloader"]["deploy"]["replicas"] == 0
    # No render workers unless asked (RENDER_REPLICAS): a stack without the render image.
    assert stack["services"]["renderer"]["deploy"]["replicas"] == 0
    assert all("ports" not in s for s in stack["services"].values())
    scraper = stack["services"]["scraper"]["deploy"]
    assert scraper["replicas"] == int(env_example()["SCRAPER_REPLICAS"])
    assert scraper["update_config"]["failure_action"] == "rollback"
    assert int(scraper["resources"]["limits"]["memory"]) == 256 * 2**20
    assert stack["services"]["scraper"]["image"] == env_example()["FLEET_IMAGE"]

    refused = (REPO_ROOT / "docker-compose.override.yml").read_text()
    (tmp_path / "both.yml").write_text(refused)
    result = subprocess.run([docker, "stack", "config", "-c", "docker-compose.yml", "-c",
                             str(tmp_path / "both.yml")], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode != 0, "the override (profiles, conditions) is compose-only"


def test_only_the_workers_metrics_listen_beyond_loopback_and_only_on_the_compose_network(
        config):
    # METRICS_HOST defaults to 127.0.0.1; Prometheus (monitoring profile) scrapes scraper:9100,
    # the healthchecks of the scrapers and the render workers ask /healthz there.
    for name, service in config["services"].items():
        env = service.get("environment") or {}
        if name in {"scraper", "renderer", "downloader"}:
            assert env["METRICS_HOST"] == "0.0.0.0" and env["METRICS_PORT"] == "9100"
            assert "ports" not in service  # reached over the compose network, never published
        else:  # unless .env sets them: the defaults, loopback and off
            assert not env.get("METRICS_HOST") and not env.get("METRICS_PORT"), name


def test_the_passwords_env_example_ships_are_placeholders_the_fleet_refuses():
    shipped = env_example()
    for variable in ("RABBITMQ_PASSWORD", "REDIS_PASSWORD"):
        with pytest.raises(ConfigError, match=f"{variable} holds a placeholder password"):
            load_settings({variable: shipped[variable]})
    # The others are no fleet setting; each is a placeholder all the same.
    for variable in ("GRAFANA_ADMIN_PASSWORD", "POSTGRES_PASSWORD", "MINIO_ROOT_PASSWORD"):
        assert shipped[variable].startswith("change-me-"), variable
    real = {k: "r3al-" + k.lower() for k in shipped if k.endswith("_PASSWORD")}
    assert load_settings({**shipped, **real}).redis_password == real["REDIS_PASSWORD"]
