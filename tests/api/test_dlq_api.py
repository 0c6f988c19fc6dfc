"""Dead letters and failures over HTTP (common/api/routes_dlq.py): listed without being taken,
replayed by reason with an admin token only, failures paged; every bad input a 422 naming it."""

from __future__ import annotations

from common.intake.producer import Producer
from common.store.keys import FAILURES_STREAM, failures_key
from tests.helpers import WorkerThread, queue_depth, results


def _dead_letter_some(settings, redis_client, site, state):
    """Two URLs that fail for good (a 503 with max_retries=0, a 404) and one invalid URL."""
    site.route("/replay-me", lambda _r: (state["status"], {"Content-Type": "text/html"},
                                         b"<html><title>back</title></html>"))
    with Producer(settings, redis_client) as producer:
        producer.submit([site.url("/replay-me"), site.url("/status/404"), "ftp://nope/"])
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0, max_retries=0)) as worker:
        worker.join(30)


def test_dead_letters_are_listed_with_counts_by_reason_and_left_in_the_queue(
        api, settings, redis_client, amqp_channel, site):
    _dead_letter_some(settings, redis_client, site, {"status": 503})
    answer = api.call("GET", "/api/dead-letters", token="read")
    assert answer.status_code == 200, answer.text
    listed = answer.json()
    assert sorted(letter["reason"] for letter in listed["letters"]) == [
        "http_404", "invalid_url", "max_retries"]
    assert listed["by_reason"] == {"http_404": 1, "invalid_url": 1, "max_retries": 1}
    assert queue_depth(amqp_channel, "failed_urls") == 3
    one = api.call("GET", "/api/dead-letters", token="read",
                   params={"reason": "http_404"}).json()
    assert [letter["url"] for letter in one["letters"]] == [site.url("/status/404")]
    assert one["looked_at"] == 3
    limited = api.call("GET", "/api/dead-letters", token="read", params={"limit": 1}).json()
    assert len(limited["letters"]) == 1


def test_replay_by_reason_needs_an_admin_token_and_routes_the_url_again(
        api, settings, redis_client, amqp_channel, site):
    state = {"status": 503}
    _dead_letter_some(settings, redis_client, site, state)
    url = site.url("/replay-me")
    state["status"] = 200  # the site recovered
    assert api.call("POST", "/api/dead-letters/replay", token=None,
                    json={"reason": "max_retries"}).status_code == 401
    assert api.call("POST", "/api/dead-letters/replay", token="read",
                    json={"reason": "max_retries"}).status_code == 403
    assert queue_depth(amqp_channel, "failed_urls") == 3  # nothing taken by the refusals
    answer = api.call("POST", "/api/dead-letters/replay", json={"reason": "max_retries"})
    assert answer.status_code == 200, answer.text
    summary = answer.json()
    assert (summary["replayed"], summary["kept"], summary["produced"]["new"]) == (1, 0, 1)
    assert redis_client.get(failures_key(url)) is None
    assert queue_depth(amqp_channel, "failed_urls") == 2  # the others were left alone
    with WorkerThread(settings.with_overrides(idle_exit_s=1.0)) as worker:
        worker.join(30)
    assert [(r["url"], r["status"]) for r in results(redis_client)] == [(url, 200)]


def test_failures_are_paged_after_a_stream_id_to_the_end(api, settings, redis_client, site):
    _dead_letter_some(settings, redis_client, site, {"status": 503})
    total = redis_client.xlen(FAILURES_STREAM)
    assert total >= 2  # the two fetched URLs' (the invalid one never reached a worker)
    first = api.call("GET", "/api/failures", token="read", params={"limit": 1})
    assert first.status_code == 200, first.text
    page = first.json()
    assert len(page["items"]) == 1 and page["next"] == page["items"][-1]["id"]
    rest = api.call("GET", "/api/failures", token="read",
                    params={"after": page["next"], "limit": 10}).json()
    assert len(rest["items"]) == total - 1 and rest["next"] is None
    assert page["items"][0]["id"] < rest["items"][0]["id"]
    urls = {item["url"] for item in page["items"] + rest["items"]}
    assert site.url("/status/404") in urls and site.url("/replay-me") in urls
    whole_ms = api.call("GET", "/api/failures", token="read", params={"after": "1"}).json()
    assert len(whole_ms["items"]) == total  # a bare millisecond id: every entry after it
    none = api.call("GET", "/api/failures", token="read", params={"job": "shop"}).json()
    assert none == {"items": [], "next": None}  # no failure of that job


def test_bad_inputs_are_refused_naming_the_field(api):
    cases = [
        ("GET", "/api/dead-letters", {"params": {"limit": 0}}, ["query", "limit"]),
        ("GET", "/api/dead-letters", {"params": {"job": "../etc"}}, ["query", "job"]),
        ("GET", "/api/dead-letters", {"params": {"run": 1}}, ["query", "run"]),
        ("GET", "/api/failures", {"params": {"after": "yesterday"}}, ["query", "after"]),
        ("GET", "/api/failures", {"params": {"limit": 5000}}, ["query", "limit"]),
        ("POST", "/api/dead-letters/replay", {"json": {"limit": -1}}, ["body", "limit"]),
        ("POST", "/api/dead-letters/replay", {"json": {"job": "a/b"}}, ["body", "job"]),
        ("POST", "/api/dead-letters/replay", {"json": {"reasons": "x"}}, ["body", "reasons"]),
    ]
    for method, path, kwargs, loc in cases:
        answer = api.call(method, path, **kwargs)
        assert answer.status_code == 422, (path, kwargs, answer.text)
        assert answer.json()["detail"][0]["loc"] == loc, (path, kwargs, answer.text)
