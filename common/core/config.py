"""Settings: the environment is read once, at start-up, into one immutable object.

Every setting is declared once, as a field of a settings group (:mod:`common.core.settings`):
its variable, parser, default text and meaning. :class:`Settings` inherits every group, and
``KNOBS``, which README's configuration table and the compose files' settings blocks are
generated from (``python -m devtools.readme``, ``python -m devtools.compose_env``), is read off
its fields. How each value is parsed: :mod:`common.core.values`.
A bad value raises :class:`common.core.errors.ConfigError` naming the variable.

Credentials are never shown: a knob marked ``secret`` (a password) appears as ``***`` and one
marked ``url`` through :func:`common.core.redact.redact_url`, in errors, ``repr(Settings)``
(what ``python -m common.core.config`` prints) and README's table; :meth:`Settings.secrets`
is what the log formatters and error printers scrub.

An empty variable counts as unset. A password, or a URL that may carry one, can come from a
file instead: ``RABBITMQ_PASSWORD_FILE=/run/secrets/...`` (:func:`raw_value`).

Entry scripts call :func:`load_settings` once and pass the result down explicitly; nothing
else in ``common/`` reads ``os.environ``. A component that needs one concern only can be given
``settings.group(FetchSettings)``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from common.core.errors import ConfigError
from common.core.settings import (
    ApiSettings,
    ArchiveSettings,
    BackoffSettings,
    BrokerSettings,
    CacheSettings,
    CrawlSettings,
    ExtractSettings,
    FetchSettings,
    IntakeSettings,
    JobSettings,
    MediaSettings,
    OpsSettings,
    PageLimitSettings,
    PolitenessSettings,
    PressureSettings,
    ProxySettings,
    ReconnectSettings,
    RecrawlSettings,
    RedisSettings,
    RenderSettings,
    SessionSettings,
    SinkSettings,
    StateSettings,
    TrustSettings,
    WorkerSettings,
)
from common.core.settings.declare import Knob, SettingsGroup, groups_of, url_list_secrets

__all__ = ["GROUPS", "KNOBS", "Knob", "Settings", "load_group", "load_settings"]

G = TypeVar("G", bound=SettingsGroup)


# The bases run from the last group to the first: a dataclass takes its fields from its last
# base first, so the fields (and KNOBS, README's table, the compose blocks) run from
# BrokerSettings to OpsSettings.
@dataclass(frozen=True, repr=False)
class Settings(OpsSettings, ApiSettings, JobSettings, RecrawlSettings, SinkSettings, PressureSettings, PageLimitSettings,
               ArchiveSettings, ExtractSettings, CrawlSettings, BackoffSettings, CacheSettings,
               PolitenessSettings, IntakeSettings, StateSettings, RenderSettings, MediaSettings, ProxySettings,
               SessionSettings, TrustSettings, FetchSettings,
               WorkerSettings, ReconnectSettings, RedisSettings, BrokerSettings):
    """Typed, immutable settings: every group's fields in one object. Build with
    :func:`load_settings`."""

    def group(self, cls: type[G]) -> G:
        """This object's values of one group (``settings.group(FetchSettings)``): what a
        component that needs only that concern is given.

        Raises:
            TypeError: ``cls`` is not one of this class's groups (:data:`GROUPS`).
        """
        if cls not in groups_of(type(self)):
            raise TypeError(f"{getattr(cls, '__name__', cls)!s} is not a settings group")
        return cls(**{f.name: getattr(self, f.name) for f in fields(cls)})


#: Every settings group, in README's order; each field of Settings belongs to exactly one.
GROUPS: tuple[type[SettingsGroup], ...] = groups_of(Settings)
#: Every knob, in README's order: what load_settings reads and the docs are generated from.
KNOBS: tuple[Knob, ...] = Settings.knobs()


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Read every knob from ``env`` (default: ``os.environ``) once.

    Raises:
        ConfigError: naming the first variable whose value does not parse.
    """
    return load_group(Settings, env)


def load_group(cls: type[G], env: Mapping[str, str] | None = None) -> G:
    """Read the knobs of one group (or of :class:`Settings`) from ``env`` (default:
    ``os.environ``); what is unset keeps its default.

    Raises:
        ConfigError: naming the first variable whose value does not parse.
    """
    source = os.environ if env is None else env
    values: dict[str, Any] = {}
    for knob in cls.knobs():
        raw = raw_value(knob, source)
        if raw is None:
            continue
        try:
            values[knob.attr] = knob.parse(raw)
        except ValueError as exc:
            raise knob.invalid(raw, exc) from None
        refuse_placeholder(knob, values[knob.attr])
    return cls(**values)


def raw_value(knob: Knob, source: Mapping[str, str]) -> str | None:
    """The text of ``knob`` in ``source``: its variable, else the file its ``*_FILE`` variable
    names (a password or a URL carrying one: Swarm and Compose secrets), else None.

    An empty value is no value (the knob's default applies): Compose passes every setting to
    every service as ``NAME: ${NAME:-}``, empty where .env does not set it. A file's content
    loses one trailing newline (``echo pw > file``), nothing else.

    Raises:
        ConfigError: both the variable and its ``*_FILE`` are set, or the file cannot be read
            or is empty; naming the variable and the path, never the content.
    """
    raw = source.get(knob.env) or None
    file_env = knob.file_env
    path = source.get(file_env) if file_env else None
    if not path:
        return raw
    if raw is not None:
        raise ConfigError(f"{knob.env} and {file_env} are both set: keep one")
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigError(f"{file_env}={path!r}: cannot read it "
                          f"({type(exc).__name__}: {exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{file_env}={path!r}: not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(f"{file_env}={path!r}: the file is empty")
    return text


#: How every password in .env.example starts: one still there was never set.
PLACEHOLDER_PREFIX = "change-me"


def refuse_placeholder(knob: Knob, value: Any) -> None:
    """Refuse a password (a ``secret`` knob's value, or one inside a ``url`` knob's URLs) that
    is still a ``change-me...`` placeholder of .env.example: compose would otherwise start a
    broker and Redis that anyone who read the repository can log into.

    Raises:
        ConfigError: naming the variable and what to set, never the value.
    """
    if not isinstance(value, str) or not (knob.secret or knob.url):
        return
    passwords = {value} if knob.secret else url_list_secrets(value)
    if any(p.strip().lower().startswith(PLACEHOLDER_PREFIX) for p in passwords):
        raise ConfigError(
            f"{knob.env} holds a placeholder password ('{PLACEHOLDER_PREFIX}...' from "
            ".env.example): set a real one in .env (or the environment), e.g. the output of "
            "`python3 -c 'import secrets; print(secrets.token_urlsafe(24))'` (compose's "
            "RabbitMQ keeps the password it first started with: `docker compose down -v`, "
            "or `rabbitmqctl change_password`)")


if __name__ == "__main__":
    try:
        print(load_settings())
    except ConfigError as exc:
        raise SystemExit(f"configuration error: {exc}") from None
