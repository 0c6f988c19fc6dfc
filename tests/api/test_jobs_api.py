"""Jobs driven over HTTP against the real fleet (issue 27): a job submitted with rules to the
API, run by a ``worker.py`` process and the job runner, watched through the progress stream
until done == known, its results paged (each record once, with the rules' data) and streamed
as JSON Lines and CSV, then deleted; a second, slow job paused, resumed and cancelled, and
refused what its state does not allow."""

from __future__ import annotations

import csv
import io
import json
import signal
import subprocess
from collections.abc import Iterator

import pytest
import requests

from tests.api.conftest import events_of
from tests.helpers import output_of, results, start_worker_process, wait_for
from tests.jobs.test_runner import FAST_ENV, runner_thread

pytestmark = pytest.mark.slow

RULES = [{"name": "pages", "path": r"^/page/\d+$", "fields": {"heading": "h1"}}]


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen]]:
    """Worker processes a test starts (``workers.append(...)``), stopped after it."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def sse(api, path: str, token: str = "read") -> Iterator[tuple[str, dict]]:
    """The (event name, JSON data) of each server-sent event of ``path``."""
    headers = {"Authorization": f"Bearer {api.read if token == 'read' else token}"}
    with requests.get(api.url + path, headers=headers, stream=True, timeout=(5, 30)) as answer:
        assert answer.status_code == 200, answer.text
        assert answer.headers["content-type"].startswith("text/event-stream")
        yield from events_of(answer)


def test_a_job_submitted_over_http_runs_to_done_equals_known_and_its_results_page_once_each(
        api, settings, redis_client, site, workers):
    pages = [site.page_url(n) for n in range(1, 26)]
    urls = [*pages, site.url("/status/404")]
    made = api.call("POST", "/api/jobs", json={"name": "shop", "seeds": {"urls": urls},
                                               "rules": RULES, "description": "over HTTP"})
    assert made.status_code == 201, made.text
    assert (made.json()["name"], made.json()["state"]) == ("shop", "created")
    [listed] = api.call("GET", "/api/jobs", token="read").json()
    assert (listed["name"], listed["state"], listed["priority"], listed["schedule"]) == (
        "shop", "created", "normal", "-")

    workers.append(start_worker_process(settings, env=FAST_ENV))
    with runner_thread(settings):
        events = list(sse(api, "/api/jobs/shop/progress/stream?interval=0.2"))
    *ticks, (last_kind, last) = events
    assert last_kind == "end", events[-3:]
    assert {kind for kind, _body in ticks} == {"message"}
    assert "running" in {body["state"] for _kind, body in ticks}, output_of(workers[0])
    dones = [body["done"] for _kind, body in ticks]
    assert dones == sorted(dones)  # progress never goes back
    assert (last["state"], last["known"], last["done"], last["results"], last["failed"]) == (
        "finished", 26, 26, 25, 1)
    assert sum(last["failed_by_reason"].values()) == 1 and last["eta_s"] in (0.0, None)

    shown = api.call("GET", "/api/jobs/shop", token="read").json()
    assert shown["state"]["state"] == "finished" and shown["seeds"] == 26
    assert json.loads(shown["definition"]["knobs"]["EXTRACT_RULES"]) == RULES
    assert shown["definition"]["description"] == "over HTTP"
    assert shown["progress"]["done"] == shown["progress"]["known"] == 26
    assert shown["domains"][0]["domain"] == "127.0.0.1"
    [run] = api.call("GET", "/api/jobs/shop/runs", token="read").json()
    assert (run["run"], run["known"], run["results"], run["failed"]) == (1, 26, 25, 1)
    assert run["ended"] >= run["started"] > 0

    seen, after, calls = [], None, 0
    while True:
        params = {"limit": 10, **({"after": after} if after else {})}
        page = api.call("GET", "/api/jobs/shop/results", token="read", params=params).json()
        seen += page["items"]
        calls += 1
        after = page["next"]
        if after is None:
            break
        assert after == page["items"][-1]["id"] and len(page["items"]) == 10
    assert calls == 3 and len(seen) == 25
    assert len({r["id"] for r in seen}) == 25 and sorted(r["url"] for r in seen) == sorted(pages)
    for record in seen:
        number = record["url"].rsplit("/", 1)[1]
        assert (record["job"], record["run"]) == ("shop", 1)
        assert record["data"] == {"heading": f"Page {number}"}, record
    stored = [r["url"] for r in results(redis_client) if r.get("job") == "shop"]
    assert [r["url"] for r in seen] == stored  # the stream's order

    lines = api.call("GET", "/api/jobs/shop/results", token="read",
                     params={"format": "jsonl"})
    assert lines.headers["content-type"].startswith("application/x-ndjson")
    assert [json.loads(line) for line in lines.text.splitlines()] == seen
    table = api.call("GET", "/api/jobs/shop/results", token="read", params={"format": "csv"})
    rows = list(csv.DictReader(io.StringIO(table.text)))
    assert [row["id"] for row in rows] == [r["id"] for r in seen]
    assert json.loads(rows[0]["data"]) == seen[0]["data"]
    tail = api.call("GET", "/api/jobs/shop/results", token="read",
                    params={"after": seen[22]["id"], "format": "jsonl"}).text.splitlines()
    assert [json.loads(line)["id"] for line in tail] == [r["id"] for r in seen[23:]]

    assert api.call("DELETE", "/api/jobs/shop").status_code == 204
    assert api.call("GET", "/api/jobs/shop", token="read").status_code == 404
    assert api.call("GET", "/api/jobs", token="read").json() == []


def state_of(api, name: str) -> dict:
    return api.call("GET", f"/api/jobs/{name}", token="read").json()["state"]


def test_a_second_job_is_paused_resumed_and_cancelled_and_refused_what_its_state_forbids(
        api, settings, redis_client, site, workers):
    urls = [site.page_url(n) for n in range(101, 161)]
    slow = {"name": "slow", "seeds": {"urls": urls}, "rules": RULES}
    assert api.call("POST", "/api/jobs", json=slow).status_code == 201
    workers.append(start_worker_process(settings, env=FAST_ENV))

    def progress() -> dict:
        return api.call("GET", "/api/jobs/slow/progress", token="read").json()

    with runner_thread(settings):
        assert wait_for(lambda: state_of(api, "slow")["state"] == "running", 30)
        paused = api.call("POST", "/api/jobs/slow/pause")
        assert paused.status_code == 200 and paused.json() == {"name": "slow", "state": "paused"}
        again = api.call("POST", "/api/jobs/slow/pause")
        assert again.status_code == 409 and "cannot pause a job that is paused" in again.text
        for method, path in (("PUT", "/api/jobs/slow"), ("DELETE", "/api/jobs/slow"),
                             ("POST", "/api/jobs?replace=true")):
            refused = api.call(method, path, json=slow)
            assert refused.status_code == 409 and "paused" in refused.json()["detail"], path
        # the pages in flight finish; every other one is parked, and nothing more is fetched
        assert wait_for(lambda: (p := progress())["done"] + p["paused"] == len(urls), 30), (
            progress(), output_of(workers[0]))
        held = progress()["results"]
        assert held < len(urls) and not wait_for(lambda: progress()["results"] > held, 1.5)

        resumed = api.call("POST", "/api/jobs/slow/resume")
        assert resumed.status_code == 200 and resumed.json()["state"] == "running"
        assert api.call("POST", "/api/jobs/slow/resume").status_code == 409
        assert wait_for(lambda: progress()["results"] > held, 30)

        cancelled = api.call("POST", "/api/jobs/slow/cancel", json={"reason": "enough seen"})
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
        for action in ("pause", "resume", "cancel"):
            late = api.call("POST", f"/api/jobs/slow/{action}")
            assert late.status_code == 409 and "cancelled" in late.json()["detail"], action
    state = state_of(api, "slow")
    assert (state["state"], state["reason"]) == ("cancelled", "enough seen")
    last = progress()
    assert last["state"] == "cancelled" and held < last["results"] < len(urls)

    replaced = api.call("PUT", "/api/jobs/slow", json={**slow, "priority": "high"})
    assert replaced.status_code == 200 and replaced.json()["state"] == "created"
    [listed] = api.call("GET", "/api/jobs", token="read").json()
    assert (listed["state"], listed["priority"], listed["run"]) == ("created", "high", 1)
    assert api.call("DELETE", "/api/jobs/slow").status_code == 204
    assert api.call("POST", "/api/jobs/slow/cancel").status_code == 404
