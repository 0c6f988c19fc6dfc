"""Addresses of one member in a Redis set or log: a URL's done mark and a rate-limit permit.

Both travel from the call that decided them (the admit script, the processor) to the call that
settles them (the result script, the I/O thread), so each has one small type instead of a bare
tuple.
"""

from __future__ import annotations

from typing import NamedTuple


class DoneMark(NamedTuple):
    """Where a URL's "outcome recorded" flag lives: a ``done:{b}`` bucket and its member."""

    key: str
    member: int


class Permit(NamedTuple):
    """One permit in a domain's rate-limit log (``ratelimit:{domain}``)."""

    log_key: str
    member: str


class Retime(NamedTuple):
    """A permit and when its request really left: the log is moved to that send time."""

    permit: Permit | None
    sent_at: float | None
