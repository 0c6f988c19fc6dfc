"""Sinks by name: what ``scrape-fleet sink KIND`` (or ``SINK=KIND``) runs.

A kind is one of:

- ``package.module:Class`` (the class may be nested: ``module:Outer.Inner``): imported as
  is; its registered name is the class's ``name`` attribute, or else the class's name;
- a name registered under the entry point group ``scrape_fleet.sinks``
  (``importlib.metadata``), by this project (``files``, ``postgres``; pyproject.toml) or by
  any installed distribution; its registered name is that name;
- ``files`` or ``postgres`` also when the project is not installed (run from a checkout).

The class must subclass :class:`scrape_fleet.sinks.Sink` or at least have ``write`` and
``close``. Every way a kind can be wrong (no such name, a module that does not import, an
attribute that is not there, a class that is not a sink, one name registered twice) is a
:class:`~common.core.errors.ConfigError` naming where the kind came from (``SINK`` or the
command line) and what to do.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING, Any

from common.core.errors import ConfigError
from common.core.imports import import_object
from common.sink.reader import Sink
from scrape_fleet.sinks import ENTRY_POINT_GROUP

if TYPE_CHECKING:
    from common.core.config import Settings

logger = logging.getLogger(__name__)

#: What ``scrape-fleet sink`` runs when neither a kind nor SINK is given.
DEFAULT_KIND = "files"
#: The built-in sinks, found even when no distribution registers them (a checkout).
BUILT_IN = {
    "files": "common.sink.files:FileSink",
    "postgres": "common.sink.postgres:PostgresSink",
}


@dataclass(frozen=True)
class SinkClass:
    """A resolved kind: the class and the name it registers under by default."""

    kind: str
    cls: type[Any]
    default_name: str


def _registered() -> dict[str, list[EntryPoint]]:
    """Every entry point of the group, by name."""
    found: dict[str, list[EntryPoint]] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(point.name, []).append(point)
    return found


def known_names() -> list[str]:
    """The names ``scrape-fleet sink NAME`` accepts: built in and registered."""
    return sorted(set(BUILT_IN) | set(_registered()))


def _check_class(found: Any, origin: str) -> type[Any]:
    """``found`` if it is a sink class; ConfigError saying what it is instead."""
    if not inspect.isclass(found):
        raise ConfigError(f"{origin}: names a {type(found).__name__}, not a class; a sink is a "
                          "class subclassing scrape_fleet.Sink")
    if issubclass(found, Sink):
        if inspect.isabstract(found):
            missing = ", ".join(sorted(getattr(found, "__abstractmethods__", ())))
            raise ConfigError(f"{origin}: {found.__qualname__} does not implement {missing}")
        return found
    lacking = [m for m in ("write", "close") if not callable(getattr(found, m, None))]
    if lacking:
        raise ConfigError(f"{origin}: {found.__module__}.{found.__qualname__} is not a sink: "
                          f"no {' or '.join(lacking)} method; subclass scrape_fleet.Sink and "
                          "implement write(entries)")
    return found


def resolve(kind: str, origin: str) -> SinkClass:
    """The sink class ``kind`` names.

    Args:
        kind: ``package.module:Class`` or a registered name.
        origin: where the kind came from, for errors (``"SINK='x'"``, ``"sink kind 'x'"``).

    Raises:
        ConfigError: what was wrong, and the names that would have worked.
    """
    kind = kind.strip()
    if ":" in kind:
        cls = _check_class(import_object(kind, origin, "Class"), origin)
        own = getattr(cls, "name", None)
        return SinkClass(kind, cls, own if isinstance(own, str) and own else cls.__name__)
    points = _registered().get(kind, [])
    targets = sorted({p.value for p in points})
    if len(targets) > 1:
        raise ConfigError(f"{origin}: the sink name {kind!r} is registered more than once "
                          f"under {ENTRY_POINT_GROUP} ({', '.join(targets)}); uninstall one or "
                          "name the class: package.module:Class")
    target = targets[0] if targets else BUILT_IN.get(kind)
    if target is None:
        raise ConfigError(f"{origin}: no sink named {kind!r} (known: "
                          f"{', '.join(known_names())}; or package.module:Class)")
    return SinkClass(kind, _check_class(import_object(target, origin, "Class"), origin), kind)


def build(found: SinkClass, settings: Settings, name: str | None = None) -> Any:
    """Build the sink: ``from_settings(settings, name)`` (``cls()`` for a class without one),
    then set its ``name``. Errors of the class's own code propagate."""
    name = name or found.default_name
    factory = getattr(found.cls, "from_settings", None)
    sink = factory(settings, name) if callable(factory) else found.cls()
    sink.name = name
    logger.info("sink %s: %s (%s.%s)", name, found.kind, found.cls.__module__,
                found.cls.__qualname__)
    return sink
