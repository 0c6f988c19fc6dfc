"""The steps of a delivery's trip through the worker, one module each, in this order:

    decode → arrive → route → wait → robots → admit → fetch → archive → hand_off → classify
    → read → shell → follow → record

:data:`STEPS` is that journey: the processor (common/work/processor.py) builds each step from
the settings it needs and runs them in this order on one :class:`~common.work.steps.trip.Trip`
per delivery. A step returns None (the next step goes on) or how the trip ends: an
:class:`~common.work.outcome.Outcome`, or an :data:`~common.work.outcome.Ending` for the
processor to settle. No step imports another: what one learns travels on
the trip. May import: what common/work may (common.core, common.broker, common.store,
common.web, common.intake) and the rest of common.work.
"""

from __future__ import annotations

from common.work.steps.admit import Admit
from common.work.steps.archive import Archive
from common.work.steps.arrive import Arrive
from common.work.steps.classify import Classify
from common.work.steps.decode import Decode
from common.work.steps.fetch import Fetch
from common.work.steps.follow import Follow
from common.work.steps.hand_off import HandOff
from common.work.steps.read import Read
from common.work.steps.record import Record
from common.work.steps.robots import Robots
from common.work.steps.route import Route
from common.work.steps.shell import Shell
from common.work.steps.wait import Wait

__all__ = ["STEPS", "Admit", "Archive", "Arrive", "Classify", "Decode", "Fetch", "Follow",
           "HandOff", "Read", "Record", "Robots", "Route", "Shell", "Wait"]

#: A delivery's journey, in order.
STEPS = (Decode, Arrive, Route, Wait, Robots, Admit, Fetch, Archive, HandOff, Classify, Read,
         Shell, Follow, Record)
