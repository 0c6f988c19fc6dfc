"""The settings block of the compose files, generated from the knobs so it cannot drift.

Every setting of README's configuration table (:data:`common.core.config.KNOBS`) reaches every
app service from `.env`: docker-compose.yml (worker, sink, scheduler) and
docker-compose.override.yml (producer, sitemap_producer, tools, sink-postgres) each hold one
YAML anchor listing every knob as ``NAME: ${NAME:-}`` (YAML anchors do not cross files, hence
two), between ``# compose-env:start`` and ``# compose-env:end``. An empty value is no value
(:func:`common.core.config.raw_value`), so a knob .env leaves out keeps its default, and a
setting that must agree across the fleet (RATE_LIMIT, CRAWL_*, ROUTING_RULES...) comes from the
same line of .env for every service.

What compose itself decides wins over .env: where RabbitMQ and Redis are (the compose
services), where the files sink writes (the sink-files volume), the passwords (compose refuses
to start without them: ``${NAME:?...}``; docker-compose.yml alone, Swarm's file, takes them
empty for deploy/swarm/secrets.yml), and, for the long-running services only, waiting for
RabbitMQ and Redis as long as it takes (Swarm starts services in any order). A service adds its
own keys after the anchor (the scraper's METRICS_HOST, sink-postgres's POSTGRES_URL).

``python -m devtools.compose_env`` rewrites both files; ``--check`` exits 1 when one is stale
(tests/test_compose_env.py asserts it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from common.core.config import KNOBS

REPO_ROOT = Path(__file__).resolve().parent.parent
START = "# compose-env:start"
END = "# compose-env:end"

#: Values compose fixes for every app service, whatever .env says.
FIXED = {
    "RABBITMQ_HOST": "rabbitmq",
    "RABBITMQ_PORT": '"5672"',
    "REDIS_HOST": "redis",
    "REDIS_PORT": '"6379"',
    # The sink-files volume: the files sink writes there, the tools read it (export.py).
    "SINK_DIR": "/data/results",
}
#: Required values: compose refuses to render without them.
REQUIRED = ("RABBITMQ_USER", "RABBITMQ_PASSWORD", "REDIS_PASSWORD")
#: Passwords docker-compose.yml lets be set empty (refusing them unset): Swarm with
#: deploy/swarm/secrets.yml deploys with them empty and reads the secrets' files instead; the
#: override (compose) refuses them empty.
SECRETS_MAY_BE_EMPTY = ("RABBITMQ_PASSWORD", "REDIS_PASSWORD")
#: Defaults compose gives where .env says nothing, per file (knob default otherwise).
DEFAULTS = {
    # worker, sink, scheduler: started in any order by Swarm, they wait for their services.
    "docker-compose.yml": {"CONNECT_RETRY_S": "inf", "ARCHIVE_DIR": "/data/archive"},
    # run-once tools: fail after CONNECT_RETRY_S's 30 s (depends_on has waited for health).
    "docker-compose.override.yml": {"ARCHIVE_DIR": "/data/archive"},
}


def required(name: str, swarm: bool = False) -> str:
    """``${NAME:?...}`` (compose: set and not empty), or ``${NAME?...}`` (``swarm``: set,
    possibly empty, for the secrets' files)."""
    if swarm and name in SECRETS_MAY_BE_EMPTY:
        return (f"${{{name}?set {name} in .env (see .env.example; empty with "
                "deploy/swarm/secrets.yml)}")
    return f"${{{name}:?set {name} in .env (see .env.example)}}"


def entry(name: str, file_name: str) -> str:
    """One line of ``file_name``'s block: ``NAME: value``."""
    if name in FIXED:
        return f"{name}: {FIXED[name]}"
    if name in REQUIRED:
        return f"{name}: {required(name, swarm=file_name == 'docker-compose.yml')}"
    return f"{name}: ${{{name}:-{DEFAULTS[file_name].get(name, '')}}}"


def block(file_name: str, indent: str) -> str:
    """The generated lines of ``file_name``'s block (markers included), at ``indent``."""
    header = (f"{START} (`python -m devtools.compose_env` writes it from "
              "common/core/knobs.py; empty: the setting's default)")
    lines = [header, *(entry(knob.env, file_name) for knob in KNOBS), END]
    return "".join(f"{indent}{line}\n" for line in lines)


def render(file_name: str, text: str) -> str:
    """``text`` with its block regenerated.

    Raises:
        ValueError: the file has no block (or more than one).
    """
    pattern = re.compile(rf"^([ \t]*){re.escape(START)}.*?^[ \t]*{re.escape(END)}\n",
                         re.S | re.M)
    found = pattern.findall(text)
    if len(found) != 1:
        raise ValueError(f"{file_name}: expected one {START} ... {END} block, found "
                         f"{len(found)}")
    return pattern.sub(lambda m: block(file_name, m.group(1)), text)


def main(argv: list[str]) -> int:
    stale = []
    for file_name in DEFAULTS:
        path = REPO_ROOT / file_name
        text = path.read_text(encoding="utf-8")
        new = render(file_name, text)
        if new == text:
            continue
        if "--check" in argv:
            stale.append(file_name)
        else:
            path.write_text(new, encoding="utf-8")
            print(f"rewrote {file_name}'s settings block")
    if stale:
        print(f"stale settings block in {', '.join(stale)}: run `python -m "
              "devtools.compose_env`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
