"""Media types: the patterns a rule, a job or MEDIA_TYPES names, and the size cap of each.

A pattern is a media type (``application/pdf``), a family (``image/*``) or ``*``. A download
is wanted when its ``Content-Type`` matches one of the request's patterns, and it may be as
large as the cap of the most specific pattern in MEDIA_MAX_BYTES that matches it (exact type,
then family, then ``*``). Shared by the settings, the rules' ``media:``, the handlers'
``page.download`` and the download workers, so the three agree on what a type is.
"""

from __future__ import annotations

import re
from typing import Any

from common.core.values import parse_size

_PATTERN = re.compile(r"(\*|[a-z0-9][a-z0-9!#$&^_.+-]*/(\*|[a-z0-9][a-z0-9!#$&^_.+-]*))")

#: The kinds a media request may name (``page.download(url, kind=...)``, a rule's ``kind``),
#: and the types each stands for when no ``types`` are given.
KINDS: dict[str, tuple[str, ...]] = {
    "image": ("image/*",),
    "document": ("application/pdf", "application/msword", "application/vnd.*", "text/*"),
    "video": ("video/*",),
    "audio": ("audio/*",),
    "file": ("*",),
}


def media_request(kind: Any, types: Any, tool: Any = None) -> dict[str, Any]:
    """The ``media`` field of a handler's ``page.download`` (without its page): ``kind`` and
    the ``types`` it narrows MEDIA_TYPES to (None: the kind's).

    Raises:
        ValueError: a kind that is not one of KINDS, or a bad type.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r:.80}")
    field: dict[str, Any] = {"kind": kind}
    if types is not None:
        types = [types] if isinstance(types, str) else list(types)
        if not types:
            raise ValueError("types: name at least one media type")
        field["types"] = [check_pattern(t) for t in types]
    if tool is not None:
        if tool not in TOOLS:
            raise ValueError(f"tool must be one of {', '.join(TOOLS)}, not {tool!r:.40}")
        field["tool"] = tool
    return field


#: The extraction tools a request may name (common/media/tools.py; MEDIA_TOOLS enables them).
TOOLS = ("yt-dlp", "gallery-dl")


def media_type_of(content_type: str | None) -> str:
    """``"Image/PNG; charset=x"`` → ``"image/png"``; missing → ``"application/octet-stream"``."""
    if not content_type:
        return "application/octet-stream"
    return content_type.split(";", 1)[0].strip().lower() or "application/octet-stream"


def check_pattern(text: object) -> str:
    """A type pattern as given, lower-cased.

    Raises:
        ValueError: not a string of the form ``type/subtype``, ``type/*`` or ``*``.
    """
    if not isinstance(text, str) or not _PATTERN.fullmatch(text.strip().lower()):
        raise ValueError(f"a media type is like image/png, image/* or *, not {text!r:.80}")
    return text.strip().lower()


def matches(pattern: str, media_type: str) -> bool:
    """Whether ``media_type`` (from :func:`media_type_of`) is one ``pattern`` names
    (``application/vnd.*`` names every ``application/vnd.`` type)."""
    if pattern == "*":
        return True
    if pattern.endswith("*"):
        return media_type.startswith(pattern[:-1])
    return media_type == pattern


def wanted(patterns: tuple[str, ...], media_type: str) -> bool:
    return any(matches(p, media_type) for p in patterns)


def narrow(asked: tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """The patterns naming what both ``asked`` (a request's) and ``allowed`` (MEDIA_TYPES)
    name: ``image/*`` within ``image/*,application/pdf`` is ``image/*``, ``*`` within it is
    the two, ``image/png`` within ``application/pdf`` is nothing."""
    both = [m for a in asked for b in allowed if (m := _meet(a, b)) is not None]
    return tuple(dict.fromkeys(both))


def _meet(a: str, b: str) -> str | None:
    """The pattern naming what both name, if one does (patterns are exact or prefixes)."""
    a_prefix, b_prefix = a.endswith("*"), b.endswith("*")
    if a_prefix and b_prefix:
        return a if a[:-1].startswith(b[:-1]) else b if b[:-1].startswith(a[:-1]) else None
    if b_prefix:
        return a if a.startswith(b[:-1]) else None
    if a_prefix:
        return b if b.startswith(a[:-1]) else None
    return a if a == b else None


def parse_caps(raw: str) -> tuple[tuple[str, int], ...]:
    """``"image/*=25MB, application/pdf=200MB, *=100MB"`` → ((pattern, bytes), ...).

    Raises:
        ValueError: an entry without ``=``, a bad pattern or size, or no ``*`` entry (every
            download needs a cap).
    """
    caps = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        pattern, sep, size = part.partition("=")
        if not sep:
            raise ValueError(f"expected type=size, got {part!r}")
        caps.append((check_pattern(pattern), parse_size(size)))
    if not any(pattern == "*" for pattern, _ in caps):
        raise ValueError("needs a '*=size' entry: the cap of every other type")
    return tuple(caps)


def cap_for(caps: tuple[tuple[str, int], ...], media_type: str) -> int:
    """The size cap of ``media_type``: that of its exact type, else the longest pattern that
    matches it, else ``*``'s (:func:`parse_caps` guarantees one)."""
    exact = [size for pattern, size in caps if pattern == media_type]
    if exact:
        return exact[0]
    fitting = [(len(pattern), size) for pattern, size in caps if matches(pattern, media_type)]
    if not fitting:
        raise ValueError(f"no cap matches {media_type!r} (caps without '*')")
    return max(fitting)[1]


def largest_cap(caps: tuple[tuple[str, int], ...]) -> int:
    """The most any download may be before its type is known."""
    return max(size for _pattern, size in caps)
