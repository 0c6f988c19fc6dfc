"""One delivery's trip through the steps: what each step found, for the steps after it.

Not a step: the one object the steps share (common/work/steps/__init__.py). A step reads the
fields the steps before it set and sets its own; nothing else travels between them. One
:class:`Trip` per delivery, the only allocation the pipeline adds to a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from common.broker.messages import WorkMessage
    from common.jobs.registry import JobRef
    from common.store.marks import DoneMark, Retime
    from common.web.fetch import FetchResult
    from common.web.ratelimit import Admission
    from common.web.robots import RobotsRules
    from common.work.page_record import PageRead
    from common.work.poison import Progress


@dataclass(slots=True)
class Trip:
    """A work-queue delivery (``body`` from ``queue``; ``redelivered``: the broker's flag) and
    what the steps learnt of it, in the order they learn it."""

    body: bytes
    queue: str
    redelivered: bool = False
    expiration_ms: int | None = None  # the delivery's own TTL (a routing rule's), if any
    message: WorkMessage | None = None  # Decode: the message
    url: str = ""  # Decode: the canonical URL
    headers: dict[str, str] | None = None  # Decode: the request's own headers (checked)
    job: JobRef | None = None  # Decode: the message's job and run (None: the default job)
    progress: Progress | None = None  # Arrive: its stage (poison.py)
    rules: RobotsRules | None = None  # Robots: the origin's robots.txt (None: not asked)
    done: DoneMark | None = None  # Admit: the URL's done mark
    domain: str = ""  # Admit: the URL's rate-limit domain
    admission: Admission | None = None  # Admit: its rate-limit turn
    response: FetchResult | None = None  # Fetch, or Admit from the cache
    cached: bool = False  # Admit: the response came from the cache (nothing fetched)
    retime: Retime | None = None  # Fetch: the permit, re-timed to the send time
    read: PageRead | None = None  # Read: the record and what to follow
    asset: Any = None  # a download worker's FetchAsset: its Download (common/media/)
    stored: Any = None  # its StoreAsset: the Stored object the store confirmed
    store_ms: float = 0.0  # how long the store took to confirm it
    handed_off: dict | None = None  # its redirect to another origin, published (redirect_to)

    @property
    def token(self) -> str:
        """The page's done-mark token: its claims on the links it publishes."""
        return f"{self.done.key}:{self.done.member}"

    @classmethod
    def begin(cls, body: bytes, queue: str, redelivered: bool,
              expiration_ms: int | None = None) -> Trip:
        """The trip of a delivery that has just come in: nothing learnt of it yet."""
        return cls(body, queue, redelivered, expiration_ms)
