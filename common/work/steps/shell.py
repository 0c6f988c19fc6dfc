"""Shell: a plainly fetched page that turns out to need a browser goes to the render queue.

After Read, an HTTP worker looks at what the page gave (common/work/render_route.py): its
rule's ``render.when_missing`` selector absent, or, with RENDER=auto, an empty JavaScript
shell (little visible text, a script). Such a page is sent on to the render queue twin of its
queue instead of being recorded, and its domain is marked so its later pages skip the plain
fetch. A render worker's pages are rendered already: this step passes there.
"""

from __future__ import annotations

from common.work.outcome import Outcome, to_render
from common.work.render_route import RenderRoute
from common.work.steps.trip import Trip


class Shell:
    def __init__(self, route: RenderRoute | None) -> None:
        self.route = route  # None: a render worker, or nothing is ever rendered

    def check_shell(self, trip: Trip) -> Outcome | None:
        """Send a page that needs a browser on to the render queue; None: record it."""
        if self.route is None or trip.read is None or trip.response is None:
            return None
        record = trip.read.record
        options = self.route.after_read(trip.job, trip.url, record.get("text_length"),
                                        trip.response.body)
        if options is None:
            return None
        return to_render(trip.message, trip.queue, options.to_message(),
                         f"a JavaScript shell ({record.get('text_length')} characters of text)",
                         trip.expiration_ms)
