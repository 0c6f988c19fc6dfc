"""Route: a page that needs a browser leaves the HTTP path for the render queue.

Before anything is asked of the site, an HTTP worker sends a page on to the render queue
twin of its queue (render_priority, render_queue: common/broker/topology.py) when its
message, its rule, its job's RENDER or its domain says it needs a browser
(common/work/render_route.py); the delivery is acked once the render queue has it. A render
worker renders what it is given: this step passes there. A message whose ``render`` field
is not a render value is dead-lettered ``bad_message``, named.
"""

from __future__ import annotations

from common.core.render_options import BadRenderOptions
from common.work.outcome import DeadLetter, Failure, Outcome, to_render
from common.work.render_route import RenderRoute
from common.work.steps.trip import Trip


class Route:
    def __init__(self, route: RenderRoute | None) -> None:
        self.route = route  # None: a render worker (its pages are rendered here)

    def route_page(self, trip: Trip) -> Outcome | DeadLetter | None:
        """Send a page that needs a browser to the render queue; None: fetch it here."""
        if self.route is None:
            return None
        message = trip.message
        try:
            options = self.route.before_fetch(trip.job, trip.url, message.extra.get("render"))
        except BadRenderOptions as exc:
            return DeadLetter(Failure("bad_message", error=f"render: {exc}"))
        if options is None:
            return None
        return to_render(message, trip.queue, options.to_message(), "needs a browser",
                         trip.expiration_ms)
