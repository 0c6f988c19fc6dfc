"""Every setting, declared once: settings groups, one frozen dataclass per concern.

A field is declared with :func:`~common.core.settings.declare.setting` (variable, parser,
default text, meaning, secret/url flags); the group is a :class:`SettingsGroup`.
:class:`common.core.config.Settings` inherits every group (one flat object, what entry scripts
load), :data:`common.core.config.KNOBS` (the configuration reference, the compose blocks, ``scrape-fleet
config``) is read off its fields, and ``settings.group(FetchSettings)`` gives one group's
values to a component that needs only those.

To add a setting: declare the field in its group; it is in KNOBS, the configuration reference (``python -m
devtools.readme``), the compose blocks (``python -m devtools.compose_env``) and
:func:`~common.core.config.load_settings` from then on. A new group also goes into Settings'
bases (common/core/config.py).
"""

from __future__ import annotations

from common.core.settings.connections import BrokerSettings, ReconnectSettings, RedisSettings
from common.core.settings.declare import Knob, SettingsGroup, setting
from common.core.settings.fetching import (
    BackoffSettings,
    CacheSettings,
    FetchSettings,
    IntakeSettings,
    PolitenessSettings,
    StateSettings,
    WorkerSettings,
)
from common.core.settings.media import MediaSettings
from common.core.settings.outputs import (
    ApiSettings,
    JobSettings,
    OpsSettings,
    RecrawlSettings,
    SinkSettings,
)
from common.core.settings.pages import (
    ArchiveSettings,
    CrawlSettings,
    ExtractSettings,
    PageLimitSettings,
    PressureSettings,
)
from common.core.settings.sessions import (
    ProxySettings,
    RenderSettings,
    SessionSettings,
    TrustSettings,
)

__all__ = [
    "ApiSettings", "ArchiveSettings", "BackoffSettings", "BrokerSettings", "CacheSettings", "CrawlSettings",
    "ExtractSettings", "FetchSettings", "MediaSettings", "IntakeSettings", "JobSettings", "Knob", "OpsSettings",
    "PageLimitSettings", "PolitenessSettings", "PressureSettings", "ProxySettings",
    "ReconnectSettings",
    "RecrawlSettings", "RedisSettings", "RenderSettings", "SessionSettings", "SettingsGroup", "SinkSettings",
    "StateSettings", "TrustSettings", "WorkerSettings", "setting",
]
