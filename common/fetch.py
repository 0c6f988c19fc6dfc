"""HTTP fetching: pooled ``requests`` sessions, timeouts, a body-size cap.

One ``requests.Session`` per worker thread (sessions are not documented as thread-safe), each
with a keep-alive connection pool, so a worker re-uses TCP connections to a site across pages.
The body is streamed and cut at ``MAX_BODY_BYTES`` of *decoded* bytes, so a compressed bomb
stops early instead of filling memory.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import requests
import requests.adapters
import urllib3

from common.config import Settings
from common.errors import FetchError

_CHUNK_BYTES = 64 * 1024


@dataclass(frozen=True)
class FetchResult:
    url: str
    final_url: str
    status: int
    content_type: str | None
    body: bytes
    elapsed_ms: float
    truncated: bool = False
    headers: dict[str, str] = field(default_factory=dict)


class Fetcher:
    """Fetches URLs with the fleet's timeouts, User-Agent and size cap."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.timeout = (settings.connect_timeout_s, settings.read_timeout_s)
        self._local = threading.local()

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = requests.Session()
            adapter = requests.adapters.HTTPAdapter(pool_connections=32, pool_maxsize=4,
                                                    max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            session.headers.update({
                "User-Agent": self.settings.user_agent,
                "Accept": "text/html,application/xhtml+xml;q=0.9,*/*;q=0.5",
                "Accept-Encoding": "gzip, deflate",
            })
            session.max_redirects = 10
            self._local.session = session
        return session

    def fetch(self, url: str) -> FetchResult:
        """GET ``url``; any HTTP status is a result, only transport failures raise.

        Raises:
            FetchError: ``kind`` is timeout, connection, too_many_redirects or invalid.
        """
        started = time.perf_counter()
        try:
            with self._session().get(url, timeout=self.timeout, stream=True) as response:
                body, truncated = self._read_capped(response)
                return FetchResult(
                    url=url, final_url=response.url, status=response.status_code,
                    content_type=response.headers.get("Content-Type"), body=body,
                    elapsed_ms=(time.perf_counter() - started) * 1000, truncated=truncated,
                    headers={k.lower(): v for k, v in response.headers.items()})
        except requests.Timeout as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="timeout") from None
        except requests.TooManyRedirects as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="too_many_redirects") from None
        except (requests.ConnectionError, urllib3.exceptions.HTTPError) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="connection") from None
        except (requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
                requests.exceptions.InvalidSchema) as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="invalid") from None
        except requests.RequestException as exc:
            raise FetchError(f"{type(exc).__name__}: {exc}", kind="connection") from None

    def _read_capped(self, response: requests.Response) -> tuple[bytes, bool]:
        cap = self.settings.max_body_bytes
        chunks: list[bytes] = []
        size = 0
        for chunk in response.iter_content(_CHUNK_BYTES):
            chunks.append(chunk)
            size += len(chunk)
            if size > cap:
                return b"".join(chunks)[:cap], True
        return b"".join(chunks), False
