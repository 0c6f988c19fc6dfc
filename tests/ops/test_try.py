"""``scrape-fleet try``: rules and handlers on one saved page, with no fleet running."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.helpers import REPO_ROOT

PAGE = ('<html><head><title>Kettle</title></head><body><h1>Kettle</h1>'
        '<p class=price>12.50</p><a class=rel href="/p/2">Spoon</a></body></html>')
RULES = """
rules:
  - name: product
    path: '^/p/'
    handler: product
    fields:
      title: h1
"""
ROUTER = '''
from scrape_fleet import Router

router = Router()

@router.handler("product")
def product(page):
    yield {"title": page.data["title"], "price": float(page.css(".price::text").get())}
    yield page.follow(page.css("a.rel::attr(href)").getall(), "product")
'''


def _try(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RABBITMQ_", "REDIS_", "EXTRACT_RULES", "HANDLERS"))}
    env.update(SCRAPE_FLEET_DIR=str(tmp_path / "no-fleet"),
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO_ROOT)]))
    return subprocess.run([sys.executable, "-m", "common.ops.console", "try", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                          check=False)


def test_try_prints_the_rules_data_and_the_handler_s_items_and_requests_without_a_fleet(
        tmp_path):
    (tmp_path / "page.html").write_text(PAGE)
    (tmp_path / "rules.yml").write_text(RULES)
    (tmp_path / "try_handlers.py").write_text(textwrap.dedent(ROUTER))
    done = _try(tmp_path, "page.html", "--url", "https://shop.test/p/1", "--rules", "rules.yml",
                "--handlers", "try_handlers:router")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["rule"], out["data"], out["handler"]) == ("product", {"title": "Kettle"},
                                                          "product")
    assert out["items"] == [{"title": "Kettle", "price": 12.5}]
    assert out["follow"] == [{"urls": ["https://shop.test/p/2"], "handler": "product",
                              "priority": False, "meta": {}, "headers": {}}]


def test_try_says_what_is_wrong_with_handlers_or_a_page_nothing_reads(tmp_path):
    (tmp_path / "page.html").write_text(PAGE)
    bad = _try(tmp_path, "page.html", "--handlers", "no_such_module_zz:router")
    assert bad.returncode == 2
    assert "configuration error: HANDLERS='no_such_module_zz:router': cannot import module" in (
        bad.stderr)
    nothing = _try(tmp_path, "page.html", "--url", "https://shop.test/p/1")
    assert nothing.returncode == 1
    assert "no rule matches https://shop.test/p/1 and no handlers are given" in nothing.stderr
    missing = _try(tmp_path, "gone.html", "--handlers", "x:y")
    assert missing.returncode == 2  # the handlers are checked before the page is read
