"""Job files (common/jobs/spec.py): every mistake is refused naming its field, files are read at
submission, and a job's page settings are the fleet's with the job's values over them."""

from __future__ import annotations

import json

import pytest

from common.core.config import load_settings
from common.jobs.spec import BadJob, JobSpec, load_job_file, parse_job

SEED = {"urls": ["http://shop.test/"]}


@pytest.mark.parametrize(("job", "field", "says"), [
    ({"seeds": SEED}, "name", "required"),
    ({"name": "Shop", "seeds": SEED}, "name", "lowercase"),
    ({"name": "x" * 64, "seeds": SEED}, "name", "at most 63"),
    ({"name": "../etc", "seeds": SEED}, "name", "lowercase"),
    ({"name": "default", "seeds": SEED}, "name", "fleet's own job"),
    ({"name": "a"}, "seeds", "at least one seed"),
    ({"name": "a", "seeds": {"urls": ["ftp://x.test/"]}}, "seeds.urls[0]", "scheme"),
    ({"name": "a", "seeds": {"urls": [7]}}, "seeds.urls[0]", "expected a URL"),
    ({"name": "a", "seeds": {"url": ["http://x.test/"]}}, "seeds.url", "unknown field"),
    ({"name": "a", "seeds": SEED, "crawl": {"max_depth": -1}}, "crawl.max_depth", ">= 0"),
    ({"name": "a", "seeds": SEED, "crawl": {"max_depth": [1]}}, "crawl.max_depth",
     "single value"),
    ({"name": "a", "seeds": SEED, "crawl": {"allowed_domains": [""]}},
     "crawl.allowed_domains", "host names"),
    ({"name": "a", "seeds": SEED, "rules": 5}, "rules", "expected rules"),
    ({"name": "a", "seeds": SEED, "rules": "missing.yml"}, "rules", "cannot read"),
    ({"name": "a", "seeds": SEED, "handlers": "no_colon"}, "handlers", "package.module"),
    ({"name": "a", "seeds": SEED, "politeness": {"rate_limit": "fast"}},
     "politeness.rate_limit", "2/second"),
    ({"name": "a", "seeds": SEED, "politeness": {"robots": "maybe"}}, "politeness.robots", ""),
    ({"name": "a", "seeds": SEED, "priority": "urgent"}, "priority", "normal, high"),
    ({"name": "a", "seeds": SEED, "limits": {"pages": 0}}, "limits.pages", "at least 1"),
    ({"name": "a", "seeds": SEED, "limits": {"pages": True}}, "limits.pages", "whole number"),
    ({"name": "a", "seeds": SEED, "limits": {"duration": "soon"}}, "limits.duration",
     "duration"),
    ({"name": "a", "seeds": SEED, "limits": {"bytes": "lots"}}, "limits.bytes", "size"),
    ({"name": "a", "seeds": SEED, "crawl": {"max_depth": 2}, "limits": {"depth": 3}},
     "limits.depth", "differs"),
    ({"name": "a", "seeds": SEED, "schedule": {}}, "schedule", "exactly one"),
    ({"name": "a", "seeds": SEED, "schedule": {"every": "1h", "cron": "* * * * *"}},
     "schedule", "exactly one"),
    ({"name": "a", "seeds": SEED, "schedule": {"cron": "61 * * * *"}}, "schedule.cron",
     "range"),
    ({"name": "a", "seeds": SEED, "schedule": {"cron": "* * *"}}, "schedule.cron", "five"),
    ({"name": "a", "seeds": SEED, "webhooks": ["javascript:alert(1)"]}, "webhooks[0]", ""),
    ({"name": "a", "seeds": SEED, "webhooks": ["http://h.test/"] * 11}, "webhooks",
     "at most"),
    ({"name": "a", "seeds": SEED, "settings": {"RABBITMQ_URL": "amqp://x"}},
     "settings.RABBITMQ_URL", "not a per-job setting"),
    ({"name": "a", "seeds": SEED, "settings": {"MAX_RECORD_BYTES": "-5"}},
     "settings.MAX_RECORD_BYTES", ""),
    ({"name": "a", "seeds": SEED, "crawl": True, "settings": {"CRAWL_ENABLED": "false"}},
     "settings.CRAWL_ENABLED", "already set"),
    ({"name": "a", "seeds": SEED, "surprise": 1}, "surprise", "unknown field"),
    ({"name": "a", "seeds": SEED, "media": {"quota": "lots"}}, "media.quota", "size"),
    ({"name": "a", "seeds": SEED, "media": {"types": ["pictures"]}}, "media.types",
     "a media type is like"),
    ({"name": "a", "seeds": SEED, "media": {"max_bytes": {"image/*": "5MB"}}},
     "media.max_bytes", "'*=size'"),
    ({"name": "a", "seeds": SEED, "media": {"where": "s3://x"}}, "media.where", "unknown"),
    ({"name": "a", "seeds": SEED, "media": {"prefix": "../../etc/"}}, "media.prefix",
     "a key prefix is like"),
    ("just text", "", "mapping"),
])
def test_a_bad_job_is_refused_naming_its_field(job, field, says):
    with pytest.raises(BadJob) as caught:
        parse_job(job)
    assert caught.value.field == field
    assert says in str(caught.value)


def test_a_job_file_reads_its_seed_list_and_rules_next_to_it(tmp_path):
    (tmp_path / "seeds.txt").write_text("# comment\nhttp://shop.test/a\n\nhttp://SHOP.test/b\n"
                                        "http://shop.test/a\n", encoding="utf-8")
    (tmp_path / "rules.yml").write_text(
        "rules:\n  - match: shop.test\n    fields: {title: {css: 'h1::text'}}\n",
        encoding="utf-8")
    (tmp_path / "job.yml").write_text(
        "name: shop\nseeds: {files: [seeds.txt], urls: [http://shop.test/]}\n"
        "rules: rules.yml\ncrawl: {max_depth: 1, allowed_domains: [shop.test]}\n"
        "limits: {pages: 50, duration: 2h, bytes: 10MiB}\nschedule: {every: 6h}\n",
        encoding="utf-8")
    spec = load_job_file(str(tmp_path / "job.yml"))
    assert spec.seed_urls == ("http://shop.test/", "http://shop.test/a", "http://shop.test/b")
    assert json.loads(spec.knobs["EXTRACT_RULES"])["rules"][0]["match"] == "shop.test"
    assert (spec.limits.pages, spec.limits.duration_s, spec.limits.bytes) == (
        50, 7200, 10 * 1024 * 1024)
    assert spec.schedule is not None and spec.schedule.every_s == 6 * 3600
    # what the registry stores comes back the same (seed URLs are stored apart)
    assert JobSpec.from_json(spec.to_json(), spec.seed_urls) == spec


def test_a_job_file_that_is_not_yaml_or_not_there_is_refused(tmp_path):
    with pytest.raises(BadJob, match="cannot read"):
        load_job_file(str(tmp_path / "missing.yml"))
    (tmp_path / "bad.yml").write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(BadJob, match="not YAML"):
        load_job_file(str(tmp_path / "bad.yml"))


def test_a_jobs_page_settings_are_the_fleets_with_its_values_over_them():
    fleet = load_settings({"CRAWL_MAX_DEPTH": "5", "MAX_RECORD_BYTES": "70000"})
    spec = parse_job({"name": "a", "seeds": SEED, "crawl": {"max_depth": 1},
                      "politeness": {"robots": False},
                      "settings": {"RECORD_MAX_LINKS": "7"}})
    mine = spec.settings_for(fleet)
    assert (mine.crawl_enabled, mine.crawl_max_depth, mine.robots_enabled,
            mine.record_max_links) == (True, 1, False, 7)
    assert mine.max_record_bytes == 70000  # not the job's: the fleet's
    assert parse_job({"name": "b", "seeds": SEED}).settings_for(fleet) is fleet


@pytest.mark.parametrize(("job", "field", "says"), [
    ({"session": {"pool": -1}}, "session.pool", ">= 0"),
    ({"session": {"pool": [3]}}, "session.pool", "single value"),
    ({"session": {"cookies": "perhaps"}}, "session.cookies", ""),
    ({"session": {"retire_statuses": [200]}}, "session.retire_statuses", "400-599"),
    ({"session": {"max_retires": 0}}, "session.max_retires", ""),
    ({"session": {"cookie": False}}, "session.cookie", "unknown field"),
    ({"session": {"login": {"url": "ftp://x.test/"}}}, "session.login", "login.url"),
    ({"session": {"login": 5}}, "session.login", "mapping"),
    ({"proxies": {"urls": ["ftp://u:pw-never-shown@p.test:21"]}}, "proxies.urls", "scheme"),
    ({"proxies": {"rotation": "daily"}}, "proxies.rotation", "request, session"),
    ({"proxies": {"url": ["http://p.test:3128"]}}, "proxies.url", "unknown field"),
    ({"settings": {"PROXY_URLS": "http://u:pw-never-shown@p.test"}}, "settings.PROXY_URLS",
     "port"),
])
def test_a_bad_session_or_proxy_field_is_refused_naming_it_and_no_credential(job, field, says):
    with pytest.raises(BadJob) as caught:
        parse_job({"name": "a", "seeds": SEED, **job})
    assert caught.value.field == field
    assert says in str(caught.value)
    assert "pw-never-shown" not in str(caught.value)


def test_a_jobs_session_and_proxies_are_its_own_settings():
    fleet = load_settings({"PROXY_URLS": "http://fleet.test:3128"})
    login = {"url": "https://shop.test/login",
             "fields": {"user": "me", "password": {"env": "SHOP_PASSWORD"}}}
    spec = parse_job({"name": "a", "seeds": SEED,
                      "session": {"cookies": True, "pool": 3, "retire_statuses": [403, 429],
                                  "max_retires": 2, "max_uses": 50, "login": login},
                      "proxies": {"urls": ["http://u:secret@p.test:3128", "socks5h://q.test:1080"],
                                  "rotation": "session"}})
    mine = spec.settings_for(fleet)
    assert (mine.cookies_enabled, mine.session_pool_size, mine.session_retire_statuses,
            mine.session_max_retires, mine.session_max_uses) == (True, 3, (403, 429), 2, 50)
    assert json.loads(mine.session_login) == login  # the secret's name, never its value
    assert mine.proxy_urls == "http://u:secret@p.test:3128,socks5h://q.test:1080"
    assert mine.proxy_rotation == "session"
    assert spec.shown_knobs()["PROXY_URLS"] == "http://u:***@p.test:3128,socks5h://q.test:1080"
    assert "secret" not in json.dumps(spec.shown_knobs())
    assert parse_job({"name": "b", "seeds": SEED, "proxies": False}
                     ).settings_for(fleet).proxy_urls == ""  # direct, whatever the fleet's
    assert not parse_job({"name": "c", "seeds": SEED, "session": {"cookies": False}}
                         ).settings_for(fleet).cookies_enabled


def test_a_jobs_render_field_is_its_render_setting_and_a_bad_one_is_named():
    fleet = load_settings({})
    assert fleet.render == "off"
    for given, expected in (("auto", "auto"), ("always", "always"), (True, "always"),
                            (False, "off")):
        spec = parse_job({"name": "a", "seeds": SEED, "render": given})
        assert spec.settings_for(fleet).render == expected
    for bad in ("sometimes", 3, ["auto"]):
        with pytest.raises(BadJob) as caught:
            parse_job({"name": "a", "seeds": SEED, "render": bad})
        assert caught.value.field == "render", caught.value


def test_a_jobs_media_sets_its_types_caps_quota_and_prefix():
    spec = parse_job({"name": "shop", "seeds": SEED, "media": {
        "types": ["image/*", "application/pdf"], "max_bytes": {"image/*": "5MB", "*": "50MB"},
        "quota": "2GB", "prefix": "shop/"}})
    settings = spec.settings_for(load_settings({}))
    assert settings.media_types == ("image/*", "application/pdf")
    assert settings.media_max_bytes == (("image/*", 5_000_000), ("*", 50_000_000))
    assert (settings.media_quota_bytes, settings.media_prefix) == (2_000_000_000, "shop/")
