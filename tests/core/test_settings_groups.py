"""Settings declared once: each group's fields are its knobs, KNOBS is read off them, and a
component can be given one group's values."""

from __future__ import annotations

import types
import typing
from dataclasses import MISSING, dataclass, fields
from typing import Any

import pytest

from common.core import values
from common.core.config import GROUPS, KNOBS, Settings, load_group, load_settings
from common.core.errors import ConfigError
from common.core.settings import (
    BackoffSettings,
    BrokerSettings,
    FetchSettings,
    OpsSettings,
    RedisSettings,
    SettingsGroup,
    WorkerSettings,
    setting,
)
from common.core.settings.declare import groups_of


def test_each_group_s_fields_are_exactly_its_knobs_and_knobs_run_group_after_group():
    for group in GROUPS:
        assert [f.name for f in fields(group)] == [k.attr for k in group.knobs()], group
    assert KNOBS == tuple(knob for group in GROUPS for knob in group.knobs())
    assert [f.name for f in fields(Settings)] == [k.attr for k in KNOBS]
    assert len(KNOBS) == len({k.env for k in KNOBS}) == len(fields(Settings))


def test_every_setting_says_what_it_does():
    assert all(knob.help.strip() for knob in KNOBS)
    with pytest.raises(TypeError, match="NO_HELP"):
        setting("NO_HELP", values.text, "x", "  ")


def _accepts(annotation: object, value: object) -> bool:
    """Whether ``value`` fits a field annotation like ``int``, ``str | None``, ``tuple[...]``."""
    if isinstance(annotation, types.UnionType):
        return any(_accepts(arg, value) for arg in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation) or annotation
    return isinstance(value, origin) and not (origin is int and isinstance(value, bool))


def test_a_knob_s_default_text_parses_to_the_field_s_typed_default():
    hints = typing.get_type_hints(Settings)
    for f in fields(Settings):
        knob = next(k for k in KNOBS if k.attr == f.name)
        if knob.default is None:
            assert f.default is None or f.default_factory is not MISSING, knob.env
            default = f.default if f.default_factory is MISSING else f.default_factory()
        else:
            default = knob.parse(knob.default)
            assert f.default == default and type(f.default) is type(default), knob.env
        assert _accepts(hints[f.name], default), (knob.env, hints[f.name], default)


def test_a_group_holds_the_values_of_the_settings_it_came_from():
    settings = load_settings({"WORKER_CONCURRENCY": "3", "USER_AGENT": "bot/2",
                              "RABBITMQ_USER": "u", "RABBITMQ_PASSWORD": "pw",
                              "REDIS_DB": "4", "THROTTLE_JITTER": "0.25"})
    fetch = settings.group(FetchSettings)
    assert type(fetch) is FetchSettings and fetch.user_agent == "bot/2"
    assert not hasattr(fetch, "concurrency") and not hasattr(fetch, "rabbitmq_url")
    worker = settings.group(WorkerSettings)
    assert (worker.concurrency, worker.effective_prefetch) == (3, 6)
    assert worker.worker_id == settings.worker_id
    assert settings.group(BrokerSettings).rabbitmq_url == "amqp://u:pw@localhost:5672/%2F"
    assert settings.group(RedisSettings).redis_url == "redis://localhost:6379/4"
    assert settings.group(BackoffSettings).throttle_jitter == 0.25
    for group in GROUPS:
        part = settings.group(group)
        assert all(getattr(part, f.name) == getattr(settings, f.name) for f in fields(group))
    for wrong in (Settings, SettingsGroup, int):
        with pytest.raises(TypeError):
            settings.group(wrong)


def test_settings_is_every_group_so_a_component_typed_for_one_accepts_it():
    assert all(isinstance(Settings(), group) for group in GROUPS)


def test_a_group_loads_alone_and_never_shows_its_password():
    broker = load_group(BrokerSettings, {"RABBITMQ_PASSWORD": "S3cr3t-pw",
                                         "WORKER_CONCURRENCY": "0"})  # not this group's: unread
    assert broker.rabbitmq_password == "S3cr3t-pw"
    assert "S3cr3t" not in repr(broker) and "rabbitmq_password='***'" in repr(broker)
    assert broker.secrets() == {"S3cr3t-pw"}
    with pytest.raises(ConfigError, match="RABBITMQ_PORT"):
        load_group(BrokerSettings, {"RABBITMQ_PORT": "nope"})


@dataclass(frozen=True, repr=False)
class OpsPlus(OpsSettings):
    """OpsSettings with one more field, as a developer would add it."""

    extra_pause_s: float = setting("EXTRA_PAUSE_S", values.positive_float, "1.5",
                                   "A pause between two things.")


def _settings_with(*groups: type[SettingsGroup]) -> type[Any]:
    """A Settings class whose bases are ``groups`` (first to last), as config.py declares it."""
    return dataclass(frozen=True, repr=False)(
        type("SettingsPlus", tuple(reversed(groups)), {"group": Settings.group}))


def test_a_new_field_declared_in_a_group_is_a_knob_and_loads_from_the_environment(monkeypatch):
    import devtools.readme

    plus = _settings_with(*(OpsPlus if g is OpsSettings else g for g in GROUPS))
    knobs = plus.knobs()
    assert [k.env for k in knobs] == [*(k.env for k in KNOBS), "EXTRA_PAUSE_S"]
    assert OpsPlus in groups_of(plus)
    assert load_group(plus, {}).extra_pause_s == 1.5
    loaded = load_group(plus, {"EXTRA_PAUSE_S": "2.5", "LOG_LEVEL": "debug"})
    assert (loaded.extra_pause_s, loaded.log_level) == (2.5, "DEBUG")
    assert loaded.group(OpsPlus).extra_pause_s == 2.5
    with pytest.raises(ConfigError, match="EXTRA_PAUSE_S"):
        load_group(plus, {"EXTRA_PAUSE_S": "-1"})
    monkeypatch.setattr(devtools.readme, "KNOBS", knobs)
    assert "| `EXTRA_PAUSE_S` | `1.5` | A pause between two things. |" in (
        devtools.readme.config_table())


def test_a_declaration_mistake_stops_the_import():
    @dataclass(frozen=True, repr=False)
    class Clash(SettingsGroup):
        concurrency: int = setting("OTHER_CONCURRENCY", values.positive_int, "1", "Again.")

    @dataclass(frozen=True, repr=False)
    class SameVariable(SettingsGroup):
        other: int = setting("WORKER_CONCURRENCY", values.positive_int, "1", "Same env.")

    @dataclass(frozen=True, repr=False)
    class Plain(SettingsGroup):
        undeclared: int = 3

    with pytest.raises(TypeError, match="exactly one group"):
        groups_of(_settings_with(*GROUPS, Clash))
    with pytest.raises(TypeError, match="WORKER_CONCURRENCY"):
        groups_of(_settings_with(*GROUPS, SameVariable))
    with pytest.raises(TypeError, match="undeclared"):
        groups_of(_settings_with(*GROUPS, Plain))
    with pytest.raises(ValueError):
        setting("BAD_DEFAULT", values.positive_int, "zero", "A default that does not parse.")
