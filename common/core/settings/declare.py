"""How a setting is declared: once, as a field of a settings group, with its environment
variable, parser, default text and meaning.

:func:`setting` makes the field: its typed default is its default text parsed by its parser
(the text is what the configuration reference shows), and its :class:`Knob` rides in the field's metadata.
:class:`SettingsGroup` is the base of every group (and of :class:`common.core.config.Settings`,
which inherits them all): it lists its knobs in field order and shows itself without a secret.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import Field, dataclass, field, fields, replace
from typing import Any, TypeVar
from urllib.parse import quote

from common.core.errors import ConfigError
from common.core.redact import MASK, redact_url, scrub, url_secrets

G = TypeVar("G", bound="SettingsGroup")


def url_list(value: str) -> list[str]:
    """The URLs of a comma-separated list (RABBITMQ_URLS); a piece without ``://`` is one more
    host of the URL before it (a Redis Cluster's ``redis+cluster://a:1,b:2``)."""
    urls: list[str] = []
    for piece in value.split(","):
        if urls and "://" not in piece:
            urls[-1] += "," + piece
        else:
            urls.append(piece)
    return urls


def url_list_secrets(value: str) -> set[str]:
    """The passwords of a URL, or of each URL of a comma-separated list."""
    return {secret for part in {value, *value.split(","), *url_list(value)}
            for secret in url_secrets(part)}


@dataclass(frozen=True)
class Knob:
    """One environment variable: its name, parser, default and meaning."""

    env: str
    attr: str
    parse: Callable[[str], Any]
    default: str | None
    help: str
    secret: bool = False  #: a password: shown as *** wherever settings are shown
    url: bool = False  #: a URL that may carry a password: shown through redact_url

    @property
    def file_env(self) -> str | None:
        """``NAME_FILE`` for a password or a URL that may carry one (a file holding the value:
        a Swarm or Compose secret); None for other knobs."""
        return f"{self.env}_FILE" if self.secret or self.url else None

    def show(self, value: str | None) -> str | None:
        """How a value of this knob may be shown (None stays None)."""
        if not value or not (self.secret or self.url):
            return value  # None, or an empty list (PROXY_URLS=''), shown as it is
        # A URL knob may hold a comma-separated list (RABBITMQ_URLS): each one redacted.
        return MASK if self.secret else ",".join(redact_url(part) for part in url_list(value))

    def invalid(self, raw: str, exc: ValueError) -> ConfigError:
        """The error for a value that does not parse, naming the variable, never a secret."""
        if not (self.secret or self.url):
            return ConfigError(f"{self.env}={raw!r} is invalid: {exc}")
        shown = self.show(raw) or ""
        text = str(exc)
        for form in (raw, repr(raw)[1:-1]):  # the parsers quote the value with !r
            text = text.replace(form, shown)
        hidden = {raw} if self.secret else url_list_secrets(raw)
        text = scrub(text, hidden | {repr(s)[1:-1] for s in hidden})
        return ConfigError(f"{self.env}={shown!r} is invalid: {text}")


def setting(env: str, parse: Callable[[str], Any], default: str | None, help: str, *,
            secret: bool = False, url: bool = False,
            factory: Callable[[], Any] | None = None) -> Any:
    """A settings field read from ``env``: the one place a setting is declared.

    Args:
        env: The environment variable.
        parse: Turns its text into the typed value (:mod:`common.core.values`).
        default: The default as text, shown in the configuration reference; the field's default is
            ``parse(default)``. None: unset (the field's default is None, or ``factory()``).
        help: What it does: the configuration reference's "Meaning" column.
        secret: A password: shown as ``***``.
        url: A URL that may carry a password: shown through redact_url.
        factory: Makes the default when ``default`` is None (a per-process value).

    Raises:
        TypeError: no help text, or ``factory`` beside a default text.
        ValueError: the default text does not parse (at import: a declaration bug).
    """
    if not help.strip():
        raise TypeError(f"{env}: every setting says what it does (help)")
    meta = {"env": env, "parse": parse, "default": default, "help": help, "secret": secret,
            "url": url}
    if factory is not None:
        if default is not None:
            raise TypeError(f"{env}: a default text or a factory, not both")
        return field(default_factory=factory, metadata=meta)
    return field(default=None if default is None else parse(default), metadata=meta)


def knob_of(f: Field[Any]) -> Knob:
    """The knob a field was declared with (:func:`setting`).

    Raises:
        TypeError: the field was not declared with :func:`setting`.
    """
    if "env" not in f.metadata:
        raise TypeError(f"settings field {f.name!r} is not declared with setting()")
    return Knob(attr=f.name, **f.metadata)


@functools.cache
def knobs_of(cls: type[SettingsGroup]) -> tuple[Knob, ...]:
    """The knobs of a group (or of Settings), in field order."""
    return tuple(knob_of(f) for f in fields(cls))


@dataclass(frozen=True, repr=False)
class SettingsGroup:
    """The settings of one concern, every field declared with :func:`setting`. Immutable; its
    repr hides passwords, so it is safe to log or print."""

    @classmethod
    def knobs(cls) -> tuple[Knob, ...]:
        """This group's knobs, in field order (Settings: every knob, the reference's order)."""
        return knobs_of(cls)

    def __repr__(self) -> str:
        """Every field, secrets as ``***`` and URLs redacted: safe to log or print."""
        parts = []
        for knob in self.knobs():
            value = getattr(self, knob.attr)
            if knob.secret or knob.url:
                value = knob.show(value)
            parts.append(f"{knob.attr}={value!r}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def secrets(self) -> frozenset[str]:
        """Every password these settings hold, as given, percent-encoded (the form the built
        URLs carry) and as written inside the URLs: what printers and log formatters scrub."""
        found: set[str] = set()
        for knob in self.knobs():
            value = getattr(self, knob.attr)
            if knob.secret and value:
                found.update((value, quote(value, safe="")))
            elif knob.url and value:
                found.update(url_list_secrets(value))
        return frozenset(found)

    def with_overrides(self: G, **changes: Any) -> G:
        """A copy with some fields changed (command-line flags, tests)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return replace(self, **changes)


@functools.cache
def groups_of(cls: type[SettingsGroup]) -> tuple[type[SettingsGroup], ...]:
    """The groups ``cls`` (Settings) lists as its bases, in field order (the reference's order).

    Raises:
        TypeError: a field belongs to no group or to two, a field is not declared with
            :func:`setting`, or two fields read the same variable.
    """
    groups = tuple(base for base in reversed(cls.__bases__) if issubclass(base, SettingsGroup))
    owners: dict[str, list[str]] = {f.name: [] for f in fields(cls)}
    for group in groups:
        for f in fields(group):
            owners[f.name].append(group.__name__)
    wrong = {name: where for name, where in owners.items() if len(where) != 1}
    if wrong:
        raise TypeError(f"every setting belongs to exactly one group: {wrong}")
    envs = [knob.env for knob in knobs_of(cls)]
    twice = sorted({env for env in envs if envs.count(env) > 1})
    if twice:
        raise TypeError(f"two settings read the same variable: {', '.join(twice)}")
    return groups
