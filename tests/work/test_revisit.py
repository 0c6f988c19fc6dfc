"""Conditional requests (common/work/revisit.py): a result keeps the page's validators, a
revisit sends them back, and a 304 is recorded as unchanged, unparsed and not a failure —
against real RabbitMQ and Redis and a loopback site."""

from __future__ import annotations

from common.broker.messages import WorkMessage
from common.store.keys import COUNTERS
from common.work.revisit import MAX_VALIDATOR_CHARS, conditional_headers
from devtools.testsite import TestSite
from tests.helpers import WorkerThread, publish_raw, results

ETAG = '"v1-abc"'
LAST_MODIFIED = "Sat, 21 Nov 2026 10:00:00 GMT"
PAGE = b"<html><head><title>Same</title></head><body><p>unchanged words</p></body></html>"


def _conditional_site(own_sites):
    site = TestSite().start()
    own_sites.append(site)
    def respond(record):
        if record.headers.get("If-None-Match") == ETAG:
            return 304, {"ETag": ETAG}, b""
        return 200, {"Content-Type": "text/html", "ETag": ETAG,
                     "Last-Modified": LAST_MODIFIED}, PAGE

    site.route("/doc", respond)
    return site


def _visit(settings, url: str, **extra) -> None:
    publish_raw(settings, "url_queue_ttl", [WorkMessage(url=url, extra=extra).to_json()])
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, cache_ttl_s=0)) as worker:
        assert worker.join(60) == 0


def test_a_result_keeps_the_validators_and_a_revisit_with_them_is_a_304_recorded_unchanged(
        settings, redis_client, own_sites):
    site = _conditional_site(own_sites)
    url = site.url("/doc")
    _visit(settings, url)
    [first] = results(redis_client)
    assert (first["status"], first["etag"], first["last_modified"]) == (200, ETAG,
                                                                        LAST_MODIFIED)
    assert first["title"] == "Same" and "unchanged" not in first

    _visit(settings, url, nonce="revisit-1",
           validators={"etag": first["etag"], "last_modified": first["last_modified"]})
    second = results(redis_client)[1]
    sent = site.requests_for("/doc")[-1].headers
    assert (sent["If-None-Match"], sent["If-Modified-Since"]) == (ETAG, LAST_MODIFIED)
    assert (second["status"], second["unchanged"], second["etag"]) == (304, True, ETAG)
    assert "content_hash" not in second and "title" not in second  # not parsed
    counters = {k.decode(): int(v) for k, v in redis_client.hgetall(COUNTERS).items()}
    assert not any(k.startswith(("dead_lettered", "retries")) for k in counters), counters
    assert redis_client.xlen("failures") == 0


def test_a_first_visit_sends_no_conditional_headers(settings, redis_client, own_sites):
    site = _conditional_site(own_sites)
    url = site.url("/doc")
    _visit(settings, url)
    sent = site.requests_for("/doc")[-1].headers
    assert "If-None-Match" not in sent and "If-Modified-Since" not in sent
    assert results(redis_client)[0]["status"] == 200


def test_validators_that_could_smuggle_headers_are_not_sent():
    bad = {"etag": '"x"\r\nX-Injected: 1', "last_modified": "x" * (MAX_VALIDATOR_CHARS + 1)}
    assert conditional_headers(WorkMessage(url="http://a.test/", extra={"validators": bad})) == ()
    fine = {"etag": '"x"', "last_modified": LAST_MODIFIED}
    assert conditional_headers(WorkMessage(url="http://a.test/", extra={"validators": fine})) == (
        'If-None-Match: "x"', f"If-Modified-Since: {LAST_MODIFIED}")
    assert conditional_headers(WorkMessage(url="http://a.test/",
                                           extra={"validators": "nope"})) == ()
