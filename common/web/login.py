"""A form login, run once per session before its first page (SESSION_LOGIN, a job's
``session.login``; docs/real-web.md). The spec, YAML or JSON (:func:`parse_login`)::

    url: https://site.example/login          # the page with the form (http/https)
    form: "form#login"                       # optional: a CSS selector or a 0-based index;
                                             # default: the first form with a password input
    fields:                                  # name -> value, laid over the form's own values
      user: crawler                          # plain text (not for pass/pwd/secret/token names)
      password: {env: SITE_PASSWORD}         # read when the spec is parsed (the worker's env)
      otp_seed: {file: /run/secrets/seed}    # a file's text, one trailing newline dropped
    success: {css: "a.logout"}               # optional, all must hold: css, text (a substring),
                                             # status, cookie (a name set); default: a 2xx
                                             # without the login form
    method: post                             # optional: over the form's own method

:func:`log_in` fetches the page with the session's :class:`~common.web.fetch.Identity`, takes
the form's own values (hidden inputs such as a CSRF token, the default submit button), lays the
fields over them and submits them to the form's action; the fetcher follows the 301/302/303
with a GET and the jar keeps each hop's cookies. Field values are never logged, never in a
repr and never in an exception: a wrong password is "success check failed", not the password.
A hostile page costs little: the fetcher caps the body, a form over MAX_FORM_INPUTS is refused.
"""

from __future__ import annotations

import codecs
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit, urlunsplit

import lxml.html
from cssselect import SelectorError
from lxml import etree
from lxml.cssselect import CSSSelector

from common.core.errors import ConfigError, FetchError, FleetError
from common.core.redact import MASK, scrub
from common.core.urls import domain_of
from common.web.fetch import Fetcher, FetchResult, Identity

__all__ = ["MAX_FORM_INPUTS", "LoginFailed", "LoginSpec", "log_in", "parse_login"]

logger = logging.getLogger(__name__)

#: A form with more inputs than this is not a login form (a hostile page's 10,000).
MAX_FORM_INPUTS = 500
#: Largest secret file read ({file: PATH}).
MAX_SECRET_FILE_BYTES = 65536
#: Forms of a page looked at (the login form among them; after login, the login form again).
_MAX_FORMS = 100
_KEYS = {"url", "form", "fields", "success", "method"}
_SUBMIT_TYPES = {"submit", "image"}
#: Field names whose value must not be written in the spec itself.
_SECRET_NAME = re.compile(r"pass|pwd|secret|token", re.I)


class LoginFailed(FleetError):
    """A login that cannot succeed for this session (no form, the success check failed): the
    message says why, never with a field's value. A failed fetch is a :class:`FetchError`."""

    reason = "login_failed"


@dataclass(frozen=True)
class LoginSpec:
    """A form login; ``fields`` hold resolved values (secrets included): never shown."""

    url: str
    fields: dict[str, str] = field(default_factory=dict)
    form: str | int | None = None  # a CSS selector, an index, None: the password form
    success: dict[str, str | int] = field(default_factory=dict)  # css/text/status/cookie
    method: str | None = None  # "GET"/"POST" over the form's own

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={MASK}" for name in self.fields)
        return (f"LoginSpec(url={_shown(self.url)!r}, form={self.form!r}, fields=[{fields}], "
                f"success={self.success!r}, method={self.method!r})")

    @property
    def site(self) -> str:
        """The site logged in to (its rate-limit domain): other sites' sessions never are."""
        return domain_of(self.url)


def parse_login(raw: str | Mapping[str, Any] | None, *, base_dir: str | None = None,
                resolve: bool = True) -> LoginSpec | None:
    """The login a setting or a job declares; None when there is none.

    Args:
        raw: SESSION_LOGIN's text (``@login.yml``, ``@login.json`` or inline JSON; "" is no
            login) or a job file's ``session.login`` mapping.
        base_dir: where a relative ``{file: PATH}`` is (default: the ``@file``'s folder, or ".").
        resolve: False checks without reading ``{env}``/``{file}`` (values ""): a job submitted
            from a machine that does not hold the secrets.

    Raises:
        ConfigError: naming the field at fault, never a value.
    """
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("@"):
            path = Path(text[1:])
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeError) as exc:
                raise ConfigError(f"login: cannot read {path}: "
                                  f"{getattr(exc, 'strerror', None) or exc}") from None
            base_dir = base_dir or str(path.parent)
        import yaml  # local: only a login's text is YAML (not a plain worker's concern)
        try:
            raw = yaml.safe_load(text)  # JSON is YAML
        except yaml.YAMLError:
            raise ConfigError("login: not valid YAML/JSON") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"login: expected a mapping, got {type(raw).__name__}")
    for key in (key for key in raw if key not in _KEYS):
        raise ConfigError(f"login.{key}: unknown field (known: {', '.join(sorted(_KEYS))})")
    url = raw.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError("login.url: expected an http(s) URL with a host")
    return LoginSpec(url=url.strip(), form=_form(raw.get("form")),
                     fields=_fields(raw.get("fields"), base_dir, resolve),
                     success=_success(raw.get("success")), method=_method(raw.get("method")))


def log_in(fetcher: Fetcher, identity: Identity, spec: LoginSpec) -> None:
    """Log the session ``identity`` is in: its cookie jar ends up holding the login's cookies.

    Raises:
        LoginFailed: the page, its form or the success check said no (final for the session).
        FetchError: a fetch failed as fetches do (transient kinds: try again later).
    """
    page = fetcher.fetch(spec.url, identity=identity)
    if not 200 <= page.status < 300:
        raise LoginFailed(f"login page {_shown(page.final_url)} answered {page.status}")
    doc = _document(page, "login page")
    form = _choose_form(doc, spec.form, page.final_url)
    pairs = _filled(form, spec.fields)
    method = spec.method or (form.get("method") or "GET").strip().upper()
    action = urljoin(page.final_url, (form.get("action") or "").strip()).split("#", 1)[0]
    if urlsplit(action).scheme not in ("http", "https"):
        raise LoginFailed(f"login form of {_shown(page.final_url)} submits to a non-http URL")
    body = urlencode(pairs, encoding=_charset(page) or "utf-8", errors="xmlcharrefreplace")
    referer = _shown(page.final_url)  # what a browser sends (CSRF checks look at them)
    headers = [f"Referer: {referer}", "Origin: " + urlunsplit((*urlsplit(referer)[:2], "", "", ""))]
    post = method == "POST"  # else the values go in the query string: kept out of messages
    target = action if post else urlunsplit((*urlsplit(action)[:3], body, ""))
    try:
        result = fetcher.fetch(target, identity=identity, headers=headers,
                               form=body.encode("ascii") if post else None)
    except FetchError as exc:
        detail = scrub(str(exc), [body, *spec.fields.values()])
        raise FetchError(f"login submit to {_shown(action)}: {detail}", kind=exc.kind,
                         sent_at=exc.sent_at) from None
    problem = _check(result, spec, identity, _signature(form, page.final_url))
    if problem:
        raise LoginFailed(f"login to {_shown(action)}: success check failed: {problem} "
                          f"(final status {result.status} at {_shown(result.final_url)})")
    logger.info("logged in at %s (%d fields sent, final status %d)", _shown(action),
                len(pairs), result.status)


# -- the spec's parts ------------------------------------------------------------------------
def _form(value: Any) -> str | int | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, str) and value.strip():
        _selector(value, "login.form")
        return value.strip()
    raise ConfigError("login.form: expected a CSS selector or a form's 0-based index")


def _fields(value: Any, base_dir: str | None, resolve: bool) -> dict[str, str]:
    if not isinstance(value, Mapping | None):
        raise ConfigError("login.fields: expected a mapping of input names to values")
    fields: dict[str, str] = {}
    for name, given in (value or {}).items():
        where = f"login.fields.{name}"
        if not isinstance(name, str) or not name:
            raise ConfigError("login.fields: input names must be non-empty text")
        if isinstance(given, str | int | float) and not isinstance(given, bool):
            if _SECRET_NAME.search(name):
                raise ConfigError(f"{where}: a secret comes from {{env: NAME}} or {{file: PATH}}")
            fields[name] = str(given)
        elif isinstance(given, Mapping) and len(given) == 1 and set(given) <= {"env", "file"}:
            (kind, ref), = given.items()
            if not isinstance(ref, str) or not ref:
                raise ConfigError(f"{where}.{kind}: expected a name")
            fields[name] = _secret(kind, ref, where, base_dir) if resolve else ""
        else:
            raise ConfigError(f"{where}: expected text, {{env: NAME}} or {{file: PATH}}")
    return fields


def _secret(kind: str, ref: str, where: str, base_dir: str | None) -> str:
    if kind == "env":
        if ref not in os.environ:
            raise ConfigError(f"{where}: environment variable {ref} is not set")
        return os.environ[ref]
    path = Path(base_dir or ".", ref)  # an absolute ref stays itself
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_SECRET_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_SECRET_FILE_BYTES:
        raise ConfigError(f"{where}: {path} is over {MAX_SECRET_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8").removesuffix("\n").removesuffix("\r")
    except UnicodeError:
        raise ConfigError(f"{where}: {path} is not UTF-8 text") from None


def _success(value: Any) -> dict[str, str | int]:
    if value is not None and (not isinstance(value, Mapping) or not value):
        raise ConfigError("login.success: expected a mapping with css, text, status or cookie")
    checks: dict[str, str | int] = {}
    for key, given in (value or {}).items():
        where = f"login.success.{key}"
        if key not in ("css", "cookie", "status", "text"):
            raise ConfigError(f"{where}: unknown check (known: css, cookie, status, text)")
        if key == "status":
            if isinstance(given, bool) or not isinstance(given, int) or not 100 <= given <= 599:
                raise ConfigError(f"{where}: expected an HTTP status (100-599)")
        elif not isinstance(given, str) or not given:
            raise ConfigError(f"{where}: expected non-empty text")
        elif key == "css":
            _selector(given, where)
        checks[key] = given
    return checks


def _method(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or value.upper() not in ("GET", "POST")):
        raise ConfigError("login.method: expected GET or POST")
    return value.upper() if value is not None else None


def _selector(css: str, where: str) -> CSSSelector:
    try:
        return CSSSelector(css)
    except (SelectorError, etree.XPathError):
        raise ConfigError(f"{where}: bad CSS selector {css!r}") from None


# -- the page's side -------------------------------------------------------------------------
def _shown(url: str) -> str:
    """A URL as messages show it: no credentials, no query (it may hold field values)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, "", ""))[:300]


def _charset(result: FetchResult) -> str | None:
    for param in (result.content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        charset = value.strip().strip("\"'")
        if name.strip().lower() == "charset" and charset:
            try:
                return codecs.lookup(charset).name
            except LookupError:
                return None
    return None


def _document(result: FetchResult, what: str | None) -> lxml.html.HtmlElement | None:
    """The page's tree; not HTML: LoginFailed naming ``what``, or None without ``what``."""
    charset = _charset(result)
    parser = lxml.html.HTMLParser(encoding=charset) if charset else None
    try:
        return lxml.html.document_fromstring(result.body, parser=parser,
                                             base_url=result.final_url)
    except (etree.ParserError, ValueError):
        if what is None:
            return None
        raise LoginFailed(f"{what} {_shown(result.final_url)} is not HTML") from None


def _choose_form(doc: lxml.html.HtmlElement, chosen: str | int | None,
                 url: str) -> lxml.html.FormElement:
    forms = list(islice(doc.iter("form"), _MAX_FORMS))
    if isinstance(chosen, int):
        form = forms[chosen] if chosen < len(forms) else None
    elif isinstance(chosen, str):
        form = next((e for e in _selector(chosen, "login.form")(doc) if e.tag == "form"), None)
    else:
        form = next((f for f in forms if f.xpath(".//input[translate(@type,'PASWORD','pasword')"
                                                 "='password']")), forms[0] if forms else None)
    if form is None:
        wanted = "any form" if chosen is None else f"the form {chosen!r}"
        raise LoginFailed(f"login page {_shown(url)} does not have {wanted}")
    if len(form.xpath(".//input|.//select|.//textarea|.//button")) > MAX_FORM_INPUTS:
        raise LoginFailed(f"login form of {_shown(url)} has over {MAX_FORM_INPUTS} inputs")
    return form


def _filled(form: lxml.html.FormElement, fields: Mapping[str, str]) -> list[tuple[str, str]]:
    """The form's own values (hidden ones, the default submit button's), ``fields`` over."""
    pairs = [(name, value) for name, value in form.form_values() if name not in fields]
    buttons = [e for e in form.xpath(".//input|.//button") if e.get("disabled") is None and
               (e.get("type") or ("submit" if e.tag == "button" else "")).lower()
               in _SUBMIT_TYPES]
    if buttons and buttons[0].get("name") and not any(b.get("name") in fields for b in buttons):
        pairs.append((buttons[0].get("name"), buttons[0].get("value") or ""))
    return pairs + list(fields.items())


def _signature(form: lxml.html.FormElement, url: str) -> tuple[str, tuple[str, ...]]:
    """What makes the login form recognisable on a later page: its action and input names."""
    action = urljoin(url, (form.get("action") or "").strip()).split("#", 1)[0]
    return _shown(action), tuple(sorted({e.get("name") or "" for e in form.inputs}))


def _check(result: FetchResult, spec: LoginSpec, identity: Identity,
           login_form: tuple[str, tuple[str, ...]]) -> str | None:
    """Why the answer to the submit is not a success (None: it is)."""
    checks = spec.success
    if not checks:
        if not 200 <= result.status < 300:
            return "the final status is not 2xx"
        doc = _document(result, None)
        if doc is not None and any(_signature(f, result.final_url) == login_form
                                   for f in islice(doc.iter("form"), _MAX_FORMS)):
            return "the login form is still on the page"
        return None
    if "status" in checks and result.status != checks["status"]:
        return f"status {result.status}, expected {checks['status']}"
    if "text" in checks:
        text = result.body.decode(_charset(result) or "utf-8", errors="replace")
        if str(checks["text"]) not in text:
            return "the expected text is not on the page"
    if "css" in checks:
        doc = _document(result, None)
        if doc is None or not _selector(str(checks["css"]), "login.success.css")(doc):
            return f"no element matches {checks['css']!r}"
    if "cookie" in checks:
        name, jar = str(checks["cookie"]), identity.cookies
        sent = [jar.header_for(url) or "" for url in (result.final_url, spec.url)] if jar else []
        names = {part.split("=", 1)[0].strip() for header in sent for part in header.split(";")}
        if name not in names:
            return f"no cookie {name!r} was set"
    return None
