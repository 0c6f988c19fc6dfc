"""Request headers a handler asks for (``page.follow(url, headers=...)``), checked once.

The same check runs where a follow request is made (the public ``Request``) and where a
message's ``headers`` are read before a fetch (a hostile or hand-written message), so a header
that could split a request, change its framing or its target never reaches libcurl.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_HEADERS_BYTES", "check_headers"]

#: Most bytes a request's own headers may take together (names, values, ": " and CRLF).
MAX_HEADERS_BYTES = 8192
#: RFC 9110's token: what a field name may be made of.
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: Framing, routing and connection headers (libcurl and the fetcher own them), the encodings
#: the fetcher can decode, and the fleet's identity (robots.txt is read for USER_AGENT).
_REFUSED = frozenset({"host", "content-length", "transfer-encoding", "connection",
                      "keep-alive", "upgrade", "te", "trailer", "proxy-connection",
                      "proxy-authorization", "expect", "accept-encoding", "user-agent"})


def check_headers(value: Any) -> dict[str, str]:
    """``value`` as a request's extra headers; ValueError saying what is wrong.

    A dict of field names (RFC 9110 tokens, not a framing or connection header) to values of
    visible characters (no CR, LF or NUL), ``MAX_HEADERS_BYTES`` at most together.
    """
    if not isinstance(value, dict):
        raise ValueError(f"headers must be a dict of names to values, not {type(value).__name__}")
    checked: dict[str, str] = {}
    size = 0
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.fullmatch(name):
            raise ValueError(f"header name {str(name)[:60]!r} is not a token")
        if name.lower() in _REFUSED:
            raise ValueError(f"header {name!r} is set by the fetcher, not by a request")
        if not isinstance(text, str):
            raise ValueError(f"header {name!r} must be a string, not {type(text).__name__}")
        if any(c in text for c in "\r\n\0"):
            raise ValueError(f"header {name!r} holds a CR, LF or NUL")
        size += len(name.encode()) + len(text.encode("utf-8", "surrogatepass")) + 4
        if size > MAX_HEADERS_BYTES:
            raise ValueError(f"headers over {MAX_HEADERS_BYTES} bytes together")
        checked[name] = text
    return checked
