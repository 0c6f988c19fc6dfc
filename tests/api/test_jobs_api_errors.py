"""What the jobs API refuses (common/api/routes_jobs*.py), served for real on the test services:
no token 401 and a read token 403 on every write route, with nothing applied; every bad input
422 naming its field (and nothing stored); unknown jobs 404; commands the state forbids 409.
Also the progress stream's ends: ``event: end`` when the job is cancelled, and no more
measuring once the client has gone."""

from __future__ import annotations

import time

import pytest
import requests

from common.jobs.progress import readings_key
from common.jobs.registry import JobRegistry
from common.jobs.spec import parse_job
from common.store.keys import JOBS
from tests.api.conftest import events_of
from tests.helpers import wait_for

SEEDS = {"urls": ["http://127.0.0.1:9/a"]}
GOOD = {"name": "alpha", "seeds": SEEDS}

#: Every route that changes something: (method, path, JSON body).
WRITES = [("POST", "/api/jobs", {**GOOD, "name": "beta"}),
          ("POST", "/api/jobs?replace=true", GOOD),
          ("PUT", "/api/jobs/alpha", {**GOOD, "priority": "high"}),
          ("POST", "/api/jobs/alpha/pause", None),
          ("POST", "/api/jobs/alpha/resume", None),
          ("POST", "/api/jobs/alpha/cancel", {"reason": "no"}),
          ("DELETE", "/api/jobs/alpha", None)]
READS = ["/api/jobs", "/api/jobs/alpha", "/api/jobs/alpha/runs", "/api/jobs/alpha/progress",
         "/api/jobs/alpha/results", "/api/jobs/alpha/results?format=csv"]


def test_every_write_route_needs_an_admin_token_and_applies_nothing_without_one(api,
                                                                               redis_client):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    JobRegistry(redis_client).start_run("alpha")
    before = redis_client.hgetall("job:alpha")
    for method, path, body in WRITES:
        anonymous = api.call(method, path, token=None, json=body)
        assert anonymous.status_code == 401, (method, path, anonymous.text)
        assert anonymous.headers["www-authenticate"] == "Bearer"
        reader = api.call(method, path, token="read", json=body)
        assert reader.status_code == 403 and "admin needed" in reader.text, (method, path)
        wrong = api.call(method, path, token="sf_not-a-token", json=body)
        assert wrong.status_code == 401, (method, path)
    assert redis_client.hgetall("job:alpha") == before
    assert sorted(redis_client.hkeys(JOBS)) == [b"alpha"]
    for path in READS:
        assert api.call("GET", path, token=None).status_code == 401, path
        assert api.call("GET", path, token="read").status_code == 200, path
    assert api.call("GET", "/api/jobs/alpha/progress/stream", token=None).status_code == 401


BAD = [  # (what is sent, the loc FastAPI answers)
    ({"name": "Bad Name", "seeds": SEEDS}, ["body", "name"]),
    ({"name": "default", "seeds": SEEDS}, ["body", "name"]),
    ({"seeds": SEEDS}, ["body", "name"]),
    ({"name": "a"}, ["body", "seeds"]),
    ({"name": "a", "seeds": {"urls": ["no-scheme"]}}, ["body", "seeds", "urls", 0]),
    ({"name": "a", "seeds": {"urls": [7]}}, ["body", "seeds", "urls"]),
    ({"name": "a", "seeds": {"files": ["/etc/passwd"]}}, ["body", "seeds", "files"]),
    ({"name": "a", "seeds": SEEDS, "rules": "rules.yml"}, ["body", "rules"]),
    ({"name": "a", "seeds": SEEDS, "rules": [{"name": "x", "fields": {"t": "h1"}}]},
     ["body", "rules"]),
    ({"name": "a", "seeds": SEEDS, "crawl": {"max_depth": -1}}, ["body", "crawl", "max_depth"]),
    ({"name": "a", "seeds": SEEDS, "crawl": "yes"}, ["body", "crawl"]),
    ({"name": "a", "seeds": SEEDS, "limits": {"pages": 0}}, ["body", "limits", "pages"]),
    ({"name": "a", "seeds": SEEDS, "limits": {"duration": "long"}},
     ["body", "limits", "duration"]),
    ({"name": "a", "seeds": SEEDS, "schedule": {"every": "soon"}},
     ["body", "schedule", "every"]),
    ({"name": "a", "seeds": SEEDS, "priority": "urgent"}, ["body", "priority"]),
    ({"name": "a", "seeds": SEEDS, "politeness": {"rate_limit": "fast"}},
     ["body", "politeness", "rate_limit"]),
    ({"name": "a", "seeds": SEEDS, "settings": {"REDIS_URL": "redis://x"}},
     ["body", "settings", "REDIS_URL"]),
    ({"name": "a", "seeds": SEEDS, "handlers": "no_router"}, ["body", "handlers"]),
    ({"name": "a", "seeds": SEEDS, "webhooks": ["https://elsewhere.example/hook"]},
     ["body", "webhooks", 0]),
    ({"name": "a", "seeds": SEEDS, "colour": "blue"}, ["body", "colour"]),
    (["not", "a", "mapping"], ["body"]),
]


@pytest.mark.parametrize(("body", "where"), BAD, ids=[".".join(map(str, w[1:])) or "body"
                                                      for _b, w in BAD])
def test_a_bad_job_definition_is_refused_naming_its_field_and_nothing_is_stored(
        api, redis_client, body, where):
    for method, path in (("POST", "/api/jobs"), ("POST", "/api/jobs?replace=true")):
        answer = api.call(method, path, json=body)
        assert answer.status_code == 422, answer.text
        locs = [item["loc"] for item in answer.json()["detail"]]
        assert any(loc[:len(where)] == where for loc in locs), locs
        assert all(item["msg"] for item in answer.json()["detail"])
    assert redis_client.hlen(JOBS) == 0 and not redis_client.keys("job:*")


def test_every_problem_of_a_definition_is_named_at_once(api):
    answer = api.call("POST", "/api/jobs", json={
        "name": "a", "seeds": {"urls": ["http://127.0.0.1:9/"], "files": ["x.txt"]},
        "rules": "rules.yml"})
    assert answer.status_code == 422
    assert [item["loc"] for item in answer.json()["detail"]] == [
        ["body", "seeds", "files"], ["body", "rules"]]
    assert "not read over HTTP" in answer.json()["detail"][0]["msg"]


def test_bad_query_values_and_a_name_differing_from_the_path_are_refused_naming_the_field(
        api):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    for path, where in (("/api/jobs/alpha/results?limit=5000", ["query", "limit"]),
                        ("/api/jobs/alpha/results?limit=0", ["query", "limit"]),
                        ("/api/jobs/alpha/results?run=0", ["query", "run"]),
                        ("/api/jobs/alpha/results?after=yesterday", ["query", "after"]),
                        ("/api/jobs/alpha/results?format=xml", ["query", "format"]),
                        ("/api/jobs/alpha/progress/stream?interval=0.1", ["query", "interval"]),
                        ("/api/jobs/alpha/progress/stream?interval=11", ["query", "interval"]),
                        ("/api/jobs/alpha/progress/stream?interval=soon",
                         ["query", "interval"])):
        answer = api.call("GET", path, token="read")
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["detail"][0]["loc"] == where, (path, answer.json())
    renamed = api.call("PUT", "/api/jobs/alpha", json={**GOOD, "name": "other"})
    assert renamed.status_code == 422 and renamed.json()["detail"][0]["loc"] == ["body", "name"]
    long_reason = api.call("POST", "/api/jobs/alpha/cancel", json={"reason": "x" * 301})
    assert long_reason.status_code == 422
    assert long_reason.json()["detail"][0]["loc"] == ["body", "reason"]
    assert api.call("GET", "/api/jobs/alpha", token="read").json()["state"]["state"] == "created"


def test_an_unknown_job_is_404_on_every_route(api):
    for method, path, body in [*WRITES[2:], *(("GET", p, None) for p in READS[1:]),
                               ("GET", "/api/jobs/alpha/progress/stream", None)]:
        answer = api.call(method, path, json=body)
        assert answer.status_code == 404, (method, path, answer.text)
        assert "alpha" in answer.json()["detail"]


def test_a_taken_name_and_commands_the_state_forbids_are_409_with_the_registrys_message(
        api):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    taken = api.call("POST", "/api/jobs", json=GOOD)
    assert taken.status_code == 409 and "exists (created)" in taken.json()["detail"]
    for action in ("pause", "resume"):
        refused = api.call("POST", f"/api/jobs/alpha/{action}")
        assert refused.status_code == 409
        assert refused.json()["detail"] == f"job 'alpha': cannot {action} a job that is created"
    replaced = api.call("POST", "/api/jobs?replace=true", json={**GOOD, "priority": "high"})
    assert replaced.status_code == 201
    shown = api.call("GET", "/api/jobs/alpha", token="read").json()
    assert shown["definition"]["priority"] == "high" and shown["progress"]["run"] == 0
    assert api.call("POST", "/api/jobs/alpha/cancel").json()["state"] == "cancelled"
    assert api.call("GET", "/api/jobs/alpha", token="read").json()["state"]["reason"] == (
        "cancelled by a user")


@pytest.fixture
def cli_job_check(settings, capsys):
    """``scrape-fleet job show NAME``'s output."""
    from common.ops.cli_job import job_main

    def show(name: str) -> str:
        assert job_main(settings, ["show", name], prog="scrape-fleet job") == 0
        assert job_main(settings, ["show", name, "--json"], prog="scrape-fleet job") == 0
        return capsys.readouterr().out
    return show


def test_a_jobs_webhook_secrets_are_not_shown(api, redis_client):
    hook = "https://127.0.0.1/done?token=s3cret-value&run=1"  # userinfo is refused
    JobRegistry(redis_client).submit(parse_job({**GOOD, "webhooks": [hook]}))
    shown = api.call("GET", "/api/jobs/alpha", token="read")
    assert shown.status_code == 200 and shown.json()["definition"]["webhooks"] == [
        "https://127.0.0.1/done?run=1&token=***"]  # canonical order
    assert "s3cret-value" not in shown.text


def test_a_job_with_sessions_and_proxies_is_taken_over_http_and_its_proxy_password_not_shown(
        api, cli_job_check):
    body = {**GOOD, "session": {"cookies": True, "pool": 3},
            "proxies": {"urls": ["http://bob:pr0xy-secret@127.0.0.1:3128"],
                        "rotation": "session"}}
    created = api.call("POST", "/api/jobs", json=body)
    assert created.status_code == 201, created.text
    shown = api.call("GET", "/api/jobs/alpha", token="read")
    knobs = shown.json()["definition"]["knobs"]
    assert knobs["SESSION_POOL_SIZE"] == "3" and knobs["PROXY_ROTATION"] == "session"
    assert knobs["PROXY_URLS"] == "http://bob:***@127.0.0.1:3128"
    assert "pr0xy-secret" not in shown.text and "pr0xy-secret" not in cli_job_check("alpha")


def test_the_progress_stream_ends_with_an_end_event_when_the_job_is_cancelled(
        api, redis_client):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    JobRegistry(redis_client).start_run("alpha")
    headers = {"Authorization": f"Bearer {api.read}"}
    started = time.monotonic()
    with requests.get(api.url + "/api/jobs/alpha/progress/stream?interval=0.2",
                      headers=headers, stream=True, timeout=(5, 10)) as answer:
        assert answer.headers["cache-control"] == "no-cache"
        seen = []
        for kind, body in events_of(answer):
            seen.append((kind, body["state"]))
            if len(seen) == 3:
                assert api.call("POST", "/api/jobs/alpha/cancel").status_code == 200
    assert seen[:3] == [("message", "running")] * 3 and seen[-1] == ("end", "cancelled")
    assert len(seen) <= 5 and time.monotonic() - started < 3  # ticks of 0.2 s


def test_the_progress_stream_of_a_job_deleted_meanwhile_ends_saying_so(api):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    headers = {"Authorization": f"Bearer {api.read}"}
    with requests.get(api.url + "/api/jobs/alpha/progress/stream?interval=0.2",
                      headers=headers, stream=True, timeout=(5, 10)) as answer:
        ticks = events_of(answer)
        kind, body = next(ticks)
        assert kind == "message" and (body["state"], body["run"], body["known"]) == (
            "created", 0, 0)
        assert api.call("DELETE", "/api/jobs/alpha").status_code == 204
        rest = list(ticks)
    assert rest[-1] == ("end", {"name": "alpha", "state": "deleted"}) and len(rest) <= 2


def test_the_progress_stream_stops_measuring_when_the_client_goes_away(api, redis_client):
    assert api.call("POST", "/api/jobs", json=GOOD).status_code == 201
    JobRegistry(redis_client).start_run("alpha")
    key = readings_key("alpha", 1)  # each tick's measure() stores one reading of a running run
    headers = {"Authorization": f"Bearer {api.read}"}
    with requests.get(api.url + "/api/jobs/alpha/progress/stream?interval=0.2",
                      headers=headers, stream=True, timeout=(5, 10)) as answer:
        ticks = events_of(answer)
        for _ in range(4):
            assert next(ticks)[1]["state"] == "running"
    assert wait_for(lambda: redis_client.zcard(key) >= 4, 2)
    time.sleep(0.5)  # a tick already under way may still store its reading
    after = redis_client.zcard(key)
    time.sleep(1.5)
    assert redis_client.zcard(key) == after


def test_the_openapi_document_describes_the_jobs_routes_and_their_models(api):
    document = api.call("GET", "/api/openapi.json", token=None).json()
    ours = {path: ops for path, ops in document["paths"].items() if path.startswith("/api/jobs")}
    assert {"/api/jobs", "/api/jobs/{name}", "/api/jobs/{name}/progress/stream",
            "/api/jobs/{name}/results", "/api/jobs/{name}/runs"} <= set(ours)
    assert all(op["tags"] == ["jobs"] for ops in ours.values() for op in ops.values())
    schemas = document["components"]["schemas"]
    assert {"JobDefinition", "ResultsPage", "RunProgress", "JobState"} <= set(schemas)
    assert "seeds" in schemas["JobDefinition"]["properties"]
    submit = ours["/api/jobs"]["post"]
    assert submit["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/JobDefinition")
