"""``package.module:name`` values (HANDLERS, EXTRACTOR, SINK): the object they name, or a
ConfigError saying what failed, one way for every setting that names user code."""

from __future__ import annotations

import importlib
from typing import Any

from common.core.errors import ConfigError

__all__ = ["import_object"]


def import_object(target: str, origin: str, expected: str) -> Any:
    """The object ``target`` (``package.module:attr.path``) names.

    Args:
        target: the value as given.
        origin: how errors name it (``HANDLERS='x:y'``).
        expected: what it should name, for the error on a malformed value (``router``).

    Raises:
        ConfigError: malformed, the module does not import (or fails while importing), or it
            lacks the attribute.
    """
    module_name, colon, attr_path = target.strip().partition(":")
    if not colon or not module_name or not attr_path:
        raise ConfigError(f"{origin}: expected package.module:{expected}, got {target!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{origin}: cannot import module {module_name!r}: "
                          f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - user code failing at import: a config error
        raise ConfigError(f"{origin}: importing module {module_name!r} failed: "
                          f"{type(exc).__name__}: {exc}") from None
    for part in attr_path.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise ConfigError(f"{origin}: module {module_name!r} has no attribute "
                              f"{attr_path!r}") from None
    return found
