"""scrape_fleet: the public API of the fleet — what your handlers, pipelines and sinks import.

Everything named in ``__all__`` follows semantic versioning (CHANGELOG.md); the engine under
``common/`` may change in any release. Workers load your router with
``HANDLERS=package.module:router``.
"""

from __future__ import annotations

from scrape_fleet.page import Page
from scrape_fleet.request import Request
from scrape_fleet.router import DropItem, HandlerResult, Router
from scrape_fleet.sinks import Entry, Sink

__version__ = "0.2.0"

__all__ = ["DropItem", "Entry", "HandlerResult", "Page", "Request", "Router", "Sink",
           "__version__"]
