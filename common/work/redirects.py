"""Redirects under the same rules as every other request.

The fetcher follows a redirect itself only while it stays on the URL's own origin (scheme,
host and port: the same robots.txt and the same rate-limit domain) and the origin's robots.txt
allows the target (:func:`common.work.steps.fetch.follow_rule`). Any other hop — to another host, another
scheme or port, or to a path robots.txt disallows — ends the fetch: the 3xx is the URL's
result (``status`` 3xx, ``redirect_to``, ``redirect``: what became of the target) and the target
goes through the producer path as a URL of its own (:meth:`Redirects.hand_off`), like a Scrapy
redirect that is a new request through the scheduler. So it is de-duplicated (a target already
seen is not fetched twice), waits for its own host's robots.txt and rate-limit turn, and is
recorded once, with ``redirected_from``.

* Scope (crawl mode): judged from the URL the producer accepted, never from where a redirect
  landed. The hand-off carries it (``scope``) and only a target in that scope is enqueued; the
  target page's links are judged against it too (common/intake/crawl.py). Outside crawl mode
  every target is enqueued (the user asked for the URL; where it moved is theirs).
* A chain of hand-offs is bounded: the message counts its hops (``hops``) and one past
  MAX_REDIRECTS is dead-lettered ``fetch_too_many_redirects``, as a chain within one origin is.
* Credentials in a target (``http://user:pass@host/``) were removed by the fetcher before the
  target reached here: never sent, never recorded, never enqueued.
* Nothing lost: the target is published (with confirm, claimed for this page's token, marked
  seen once confirmed) *before* the 3xx is recorded; a worker killed in between redelivers the
  URL, whose second hand-off finds the target claimed by its own token and publishes it if it
  was not confirmed. A publish that fails is a transient failure of the URL (retried), never a
  recorded 3xx with a target nobody will fetch.
* A job's redirect stays in its run: the target is published with the job (deduped in the
  run, recorded with ``job`` and ``run``), under the job's crawl settings when given.
"""

from __future__ import annotations

from typing import Any

import redis

from common.broker import topology
from common.broker.messages import WorkMessage
from common.core.config import Settings
from common.core.errors import AMQP_CONNECTION_LOST, ServiceUnavailable
from common.intake.crawl import LinkFollower, ThreadProducers
from common.jobs.registry import JobRef


class HandOffFailed(Exception):
    """The target could not be published: retry the redirected URL later."""


def scope_of(message: WorkMessage) -> str | None:
    """The URL the producer accepted, for a message reached through a redirect (else None)."""
    scope = message.extra.get("scope")
    return scope if isinstance(scope, str) else None


class Redirects:
    def __init__(self, settings: Settings, client: redis.Redis,
                 follower: LinkFollower | None) -> None:
        # Crawl mode: its scope rule and page budget. A follower built for handlers' follow
        # requests alone changes nothing here: outside crawl mode every target is enqueued.
        self.client = client
        self.follower = follower if settings.crawl_enabled else None
        self._own_producers = follower is None
        self.producers = follower.producers if follower else ThreadProducers(settings, client)

    def hand_off(self, url: str, message: WorkMessage, queue: str, target: str, hops: int,
                 token: str, job_settings: Settings | None = None) -> dict[str, Any]:
        """Enqueue ``target`` (the redirect of ``url`` that the fetch did not follow); returns
        the fields the 3xx's record gets. ``hops`` counts every redirect so far, this one
        included; ``token`` is the page's done-mark token (its claims); ``job_settings``: the
        page settings of the message's job (its crawl mode, scope and budget).

        Raises:
            HandOffFailed: the target was not published (the broker or Redis failed).
        """
        fields: dict[str, Any] = {"redirect_to": target}
        scope = scope_of(message) or url
        job = JobRef.of(message.extra)
        follower = self.follower
        if job is not None:  # the job's crawl mode, its run's budget
            crawl = job_settings.crawl_enabled if job_settings is not None else bool(follower)
            follower = LinkFollower(job_settings or follower.settings, self.client, job=job,
                                    producers=self.producers) if crawl else None
        if follower is not None and not follower.in_scope(scope, target):
            fields["redirect"] = "out_of_scope"
            return fields
        try:
            summary = self.producers.get().submit(
                [target], depth=message.depth, claim_token=token,
                force_priority=queue == topology.PRIORITY_QUEUE,
                keep=follower.within_budget if follower else None,
                extra={"scope": scope, "redirected_from": url, "hops": hops}, job=job)
        except (ServiceUnavailable, redis.RedisError, *AMQP_CONNECTION_LOST) as exc:
            raise HandOffFailed(f"{type(exc).__name__}: {exc}") from exc
        if summary.failed:
            raise HandOffFailed("the broker did not confirm the redirect target")
        fields["redirect"] = ("queued" if summary.new else "invalid" if summary.invalid
                              else "over_budget" if summary.over_budget else "duplicate")
        return fields

    def close(self) -> None:
        if self._own_producers:
            self.producers.close()
