"""What a failed libcurl transfer means for the fleet: the kind of :class:`FetchError`.

Transient kinds (retried with backoff: common/core/errors.py) are ``timeout``, ``connection``
and ``proxy`` (the proxy failed, not the site); every other kind dead-letters at once:
``blocked`` (the address guard), ``tls_certificate`` (the site's certificate is not to be
trusted: curl's own message says why), ``invalid``, ``headers_too_large``.
"""

from __future__ import annotations

import pycurl

from common.core.config import Settings
from common.core.errors import FetchError
from common.core.redact import redact_url
from common.web.curl import Transfer

# libcurl error codes (curl/curl.h) and what they mean for the fleet.
_TIMEOUT_CODES = frozenset({pycurl.E_OPERATION_TIMEDOUT})
#: CURLE_WEIRD_SERVER_REPLY (8; pycurl names it E_FTP_WEIRD_SERVER_REPLY): a response libcurl
#: refuses to read, e.g. a NUL or a bare CR in a header. The server sends it again on a retry:
#: permanent ``fetch_invalid``, not a transient connection error.
_WEIRD_SERVER_REPLY = getattr(pycurl, "E_WEIRD_SERVER_REPLY", 8)
_INVALID_CODES = frozenset({pycurl.E_UNSUPPORTED_PROTOCOL, pycurl.E_URL_MALFORMAT,
                            pycurl.E_BAD_CONTENT_ENCODING, _WEIRD_SERVER_REPLY})
_HEADER_TOO_LARGE_CODES = frozenset({getattr(pycurl, "E_TOO_LARGE", 100)})
#: The site's certificate is not to be trusted (untrusted issuer, expired, another host's,
#: revoked, a pinned key that differs) or our CA file is unreadable: permanent
#: ``tls_certificate``, curl's message kept. A handshake that fails otherwise (35, a reset)
#: stays a transient ``connection``.
_TLS_CERTIFICATE_CODES = frozenset({51, pycurl.E_PEER_FAILED_VERIFICATION,
                                    getattr(pycurl, "E_SSL_ISSUER_ERROR", 83),
                                    getattr(pycurl, "E_SSL_PINNEDPUBKEYNOTMATCH", 90),
                                    getattr(pycurl, "E_SSL_INVALIDCERTSTATUS", 91),
                                    pycurl.E_SSL_CACERT_BADFILE})
#: With a proxy: the proxy could not be resolved, reached, or would not tunnel (CURLE_PROXY,
#: 97, a SOCKS or CONNECT refusal): kind ``proxy``, transient (another proxy may serve).
_PROXY_CODES = frozenset({pycurl.E_COULDNT_RESOLVE_PROXY, pycurl.E_COULDNT_CONNECT, 97})


def classify(error: pycurl.error, transfer: Transfer, sent_at: float | None,
             settings: Settings, proxy: str | None = None,
             tunnel: int | None = None) -> FetchError:
    """The FetchError a failed libcurl transfer is, by its code and what the open-socket
    callback saw (``transfer.refused``: addresses the guard refused). Through a proxy,
    ``tunnel`` is the status of its answer to CONNECT (0: none came; None: no tunnel)."""
    code, message = error.args[0], error.args[1] if len(error.args) > 1 else ""
    text = f"curl error {code}: {message}"
    if proxy:
        text = text.replace(proxy, redact_url(proxy))
    if transfer.refused and (not transfer.attempted or code == pycurl.E_COULDNT_CONNECT):
        # Only a refused address could have answered (libcurl resolves 'localhost' to
        # ::1 and 127.0.0.1 itself, for one): the guard's refusal is the reason.
        reason = transfer.fetcher.guard.reason(", ".join(sorted(set(transfer.refused))))
        if transfer.attempted:
            reason += f"; allowed {', '.join(transfer.attempted)} failed: {text}"
        return FetchError(reason, kind="blocked", sent_at=sent_at)
    if code in _TLS_CERTIFICATE_CODES:
        return FetchError(text, kind="tls_certificate", sent_at=sent_at)
    hung_tunnel = code in _TIMEOUT_CODES and tunnel == 0  # the proxy never answered CONNECT
    if proxy and (code in _PROXY_CODES or "proxy" in message.lower() or hung_tunnel):
        return FetchError(f"{text} (proxy {redact_url(proxy)})", kind="proxy",
                          sent_at=sent_at)
    if code in _TIMEOUT_CODES:
        return FetchError(f"{text} (FETCH_TOTAL_TIMEOUT_S "
                          f"{settings.fetch_total_timeout_s:g}s or a stalled read)",
                          kind="timeout", sent_at=sent_at)
    if code in _INVALID_CODES:
        return FetchError(text, kind="invalid", sent_at=sent_at)
    if code in _HEADER_TOO_LARGE_CODES:
        return FetchError(text, kind="headers_too_large", sent_at=sent_at)
    return FetchError(text, kind="connection", sent_at=sent_at)
