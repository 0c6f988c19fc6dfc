"""Real RabbitMQ and Redis servers for tests and the local demo, started on loopback only.

Three ways to get the services, tried in this order by :func:`fleet_services`:

1. ``RABBITMQ_URL`` / ``REDIS_URL`` from the environment, used as-is (each independently).
2. Docker containers through testcontainers, only when a *local* Docker engine answers.
3. The Debian ``rabbitmq-server`` / ``redis-server`` binaries (``scripts/bootstrap.sh``
   installs them), run as child processes on free 127.0.0.1 ports, each in its own temporary
   directory. RabbitMQ is started from the real scripts in ``/usr/lib/rabbitmq/bin`` (the
   ``/usr/sbin`` wrapper drops the environment) with its own node name, ports and HOME.

A local RabbitMQ node takes 5-20 s to start, so tests start it once per session.

PostgreSQL (for the postgres result sink) comes the same three ways, from
:func:`~devtools.services.postgres_server.postgres_service`: ``POSTGRES_URL``, a testcontainers
``postgres:15``, or :class:`LocalPostgres` from Debian's binaries, run as the ``postgres`` user
when we are root (initdb and postgres refuse root).

Modules: :mod:`~devtools.services.fleet` (choosing the source, :func:`reset_state`),
:mod:`~devtools.services.rabbitmq_server`, :mod:`~devtools.services.redis_server`,
:mod:`~devtools.services.postgres_server` and
:mod:`~devtools.services.base` (ports, binaries, process groups). ``python -m
devtools.services`` starts both and prints their URLs.
"""

from __future__ import annotations

from devtools.services.base import ServicesUnavailable, find_binaries
from devtools.services.fleet import FleetServices, fleet_services, reset_state
from devtools.services.postgres_server import (
    LocalPostgres,
    PostgresService,
    find_postgres_bin,
    postgres_service,
    scratch_database,
)
from devtools.services.rabbitmq_server import LocalRabbitMQ
from devtools.services.redis_server import LocalRedis

__all__ = [
    "FleetServices",
    "LocalPostgres",
    "LocalRabbitMQ",
    "LocalRedis",
    "PostgresService",
    "ServicesUnavailable",
    "find_binaries",
    "find_postgres_bin",
    "fleet_services",
    "postgres_service",
    "reset_state",
    "scratch_database",
]
