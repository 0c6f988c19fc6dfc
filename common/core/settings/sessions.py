"""Settings groups of the real web: whom the fleet trusts (TLS), who it is to a site (cookies
and sessions, a login), which way its requests go (proxies), and the browser that renders
the pages that need one.

Each field is declared once with :func:`~common.core.settings.declare.setting`; docs/real-web.md
says how they work together.
"""

from __future__ import annotations

from dataclasses import dataclass

from common.core import values
from common.core.settings.declare import SettingsGroup, setting


def status_list(raw: str) -> tuple[int, ...]:
    """``"401,403,429"`` → (401, 403, 429): HTTP statuses from 400 to 599; empty: ()."""
    statuses = []
    for part in filter(None, (p.strip() for p in raw.split(","))):
        if not part.isdigit() or not 400 <= int(part) <= 599:
            raise ValueError(f"expected HTTP error statuses (400-599), got {part!r}")
        statuses.append(int(part))
    return tuple(statuses)


def host_list(raw: str) -> tuple[str, ...]:
    """``"a.example, B.example"`` → ("a.example", "b.example"); empty: ()."""
    hosts = tuple(h.strip().lower().rstrip(".") for h in raw.split(",") if h.strip())
    for host in hosts:
        if "/" in host or ":" in host or " " in host:
            raise ValueError(f"expected host names, got {host!r}")
    return hosts


@dataclass(frozen=True, repr=False)
class TrustSettings(SettingsGroup):
    """TLS: which certificate authorities a fetch trusts, and where it trusts none (loudly)."""

    fetch_ca_bundle: str = setting(
        "FETCH_CA_BUNDLE", values.text, "",
        "A PEM file, or a directory of .pem/.crt files, of certificate authorities trusted "
        "for pages, robots.txt, sitemaps and redirects (a private CA, a TLS-inspecting "
        "proxy's); FETCH_CA_MODE says whether they add to or replace the default roots.")
    fetch_ca_mode: str = setting(
        "FETCH_CA_MODE", values.choice("add", "replace"), "add",
        "`add`: FETCH_CA_BUNDLE's authorities are trusted besides the default roots "
        "(certifi's; or OpenSSL's SSL_CERT_FILE, when the environment sets it, which replaces "
        "them as OpenSSL does); `replace`: only they are.")
    fetch_insecure_domains: tuple[str, ...] = setting(
        "FETCH_INSECURE_DOMAINS", host_list, "",
        "Hosts (and their subdomains) fetched WITHOUT checking their certificate: a staging "
        "site's self-signed one. Logged as a warning at start by every process, and marked "
        "`tls_verified: false` in each record. Prefer FETCH_CA_BUNDLE.")


@dataclass(frozen=True, repr=False)
class SessionSettings(SettingsGroup):
    """Who the fleet is to a site: cookie jars shared by the fleet, sessions, a login."""

    cookies_enabled: bool = setting(
        "COOKIES_ENABLED", values.boolean, "true",
        "Keep the cookies sites set, per job and site, shared by every worker, and send "
        "them back (RFC 6265); a job or rule may turn them off.")
    cookie_jar_max_cookies: int = setting(
        "COOKIE_JAR_MAX_COOKIES", values.positive_int, "100",
        "Most cookies kept in one jar (a job's session on one site); the oldest go first.")
    cookie_jar_max_bytes: int = setting(
        "COOKIE_JAR_MAX_BYTES", values.positive_int, "65536",
        "Largest jar (names and values together); a cookie over 4096 bytes is never kept.")
    session_pool_size: int = setting(
        "SESSION_POOL_SIZE", values.non_negative_int, "0",
        "Sessions per job and site, each with its own cookie jar (and its own proxy when "
        "PROXY_ROTATION=session); requests are spread over the healthy ones. 0: one jar, "
        "and a blocking status is an answer like any other.")
    session_retire_statuses: tuple[int, ...] = setting(
        "SESSION_RETIRE_STATUSES", status_list, "401,403,429",
        "With a session pool: an answer with one of these statuses retires the session that "
        "got it (a fresh one takes its place) and its URL is tried again on another.")
    session_max_retires: int = setting(
        "SESSION_MAX_RETIRES", values.positive_int, "3",
        "Sessions one URL may retire before its blocking answer is its outcome.")
    session_max_uses: int = setting(
        "SESSION_MAX_USES", values.non_negative_int, "0",
        "Requests a session serves before it is retired and replaced (0: no limit).")
    session_login: str = setting(
        "SESSION_LOGIN", values.text, "",
        "A form login run once per session before its first page: @login.yml or inline "
        "JSON (docs/real-web.md); a job's `session.login` replaces it for the job.")


@dataclass(frozen=True, repr=False)
class ProxySettings(SettingsGroup):
    """Which way requests go: a pool of proxies, rotated, rested when they fail."""

    proxy_urls: str = setting(
        "PROXY_URLS", values.text, "",
        "Proxies for every fetch, comma-separated: http://, https://, socks5:// (the fleet "
        "resolves names) or socks5h:// (the proxy does), user:password@ allowed (redacted "
        "everywhere; or PROXY_URLS_FILE). Empty: direct.", url=True)
    proxy_rotation: str = setting(
        "PROXY_ROTATION", values.choice("request", "session"), "request",
        "`request`: each request takes the next healthy proxy; `session`: a session keeps "
        "its proxy (sticky) while the proxy is healthy.")
    proxy_rest_s: float = setting(
        "PROXY_REST_S", values.positive_float, "60",
        "A proxy that failed (refused, timed out, answered 407 or 5xx to CONNECT) rests this "
        "long, fleet-wide; its URL is tried again through another.")


@dataclass(frozen=True, repr=False)
class RenderSettings(SettingsGroup):
    """Pages that need a browser: the Chromium the render workers drive, and its bounds."""

    browser_executable: str = setting(
        "BROWSER_EXECUTABLE", values.text, "/usr/bin/chromium",
        "The Chromium the render workers drive (the distribution's package; no browser is "
        "ever downloaded).")
    render_timeout_s: float = setting(
        "RENDER_TIMEOUT_S", values.positive_float, "30",
        "Longest a page may take to render (load, scripts, waiting for its content); past it "
        "the page is closed and the fetch fails as a timeout.")
    render_block_types: str = setting(
        "RENDER_BLOCK_TYPES", values.text, "image,font,media",
        "Request types a rendering page may not make (Chromium's resource types: image, font, "
        "media, stylesheet, script, xhr, fetch, websocket, ...), comma-separated.")
    render_max_dom_nodes: int = setting(
        "RENDER_MAX_DOM_NODES", values.positive_int, "200000",
        "A rendered page with more DOM nodes than this is refused (fetch_invalid), as a "
        "parsed one is (MAX_PAGE_TAGS).")
    render_pages_per_browser: int = setting(
        "RENDER_PAGES_PER_BROWSER", values.positive_int, "200",
        "Pages a browser renders before it is closed and a fresh one started (leaks end "
        "with it).")
    render_max_bytes: int = setting(
        "RENDER_MAX_BYTES", values.positive_int, "52428800",
        "Most bytes a rendering page may download in all (its document, scripts, XHR...); "
        "past it the page is stopped and dead-lettered (fetch_too_large).")
    render_max_browser_mb: int = setting(
        "RENDER_MAX_BROWSER_MB", values.non_negative_int, "1024",
        "A browser whose processes hold more than this (PSS, MiB) is recycled after its page; "
        "0: only RENDER_PAGES_PER_BROWSER recycles.")
    render_threads: int = setting(
        "RENDER_THREADS", values.positive_int, "1",
        "Browsers a render worker runs at once, each in a thread with its own Chromium (one "
        "per core at most: rendering is CPU-bound).")
    render_worker: bool = setting(
        "RENDER_WORKER", values.boolean, "false",
        "This worker renders: it consumes the render queues (render_priority, render_queue) "
        "and loads pages in Chromium. `scrape-fleet work --render` sets it.")
    render: str = setting(
        "RENDER", values.choice("off", "auto", "always"), "off",
        "Which pages a browser renders (docs/rendering.md). `off`: those a rule "
        "(`render:`) or a handler (`page.follow(url, render=True)`) asks for; `auto`: also a "
        "fetched page that looks like an empty JavaScript shell, and its domain's later pages "
        "for RENDER_DOMAIN_TTL_S; `always`: every page. Needs render workers running "
        "(`scrape-fleet work --render`).")
    render_domain_ttl_s: int = setting(
        "RENDER_DOMAIN_TTL_S", values.positive_int, "86400",
        "How long a domain found to need a browser sends its pages straight to rendering.")
