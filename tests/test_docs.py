"""The docs' reference pages are generated from the code (devtools/readme.py) and up to date,
and README.md keeps what a first visit needs."""

from __future__ import annotations

import re
from pathlib import Path

from common.broker import topology
from common.ops.console import COMMANDS
from common.work.rules_file import load_rules
from devtools import api_reference, readme

REPO_ROOT = Path(__file__).resolve().parent.parent
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
REFERENCE = DOCS / "reference"


def _section(page: Path, name: str) -> str:
    found = readme.section(page.read_text(encoding="utf-8"), name)
    assert found is not None, f"{page.name} lost its {name} markers"
    return found


def test_the_configuration_page_is_generated_from_the_settings():
    assert _section(REFERENCE / "configuration.md", "config-table") == readme.config_table(), (
        "docs/reference/configuration.md is stale: python -m devtools.readme")


def test_the_layout_page_matches_the_tree():
    section = _section(REFERENCE / "layout.md", "layout")
    assert section == readme.layout(), (
        "docs/reference/layout.md is stale: python -m devtools.readme")
    on_disk = {str(p.relative_to(REPO_ROOT)) for p in REPO_ROOT.glob("common/*/**/*.py")
               if p.name != "__init__.py"}
    listed = set(re.findall(r"`(common/[\w/]+\.py)`", section))
    assert listed == on_disk
    assert "`common/work/steps/`" in section, "a room's subpackage is not listed"
    rooms = {p.parent.name for p in REPO_ROOT.glob("common/*/__init__.py")}
    assert rooms == set(readme.ROOMS), "a room of common/ is missing from devtools.readme.ROOMS"


def test_the_key_list_is_generated_from_the_key_schema():
    section = _section(REFERENCE / "redis-and-queues.md", "redis-keys")
    assert section == readme.redis_keys(), (
        "docs/reference/redis-and-queues.md is stale: python -m devtools.readme")
    for key in ("crawled_urls:", "done:", "workers:", "crawl:pages:", "robots:lock:"):
        assert f"`{key}" in section


def test_the_api_page_is_generated_from_the_openapi_document_with_every_route_and_scope():
    section = _section(REFERENCE / "api.md", "api-reference")
    assert section == api_reference.api_reference(), (
        "docs/reference/api.md is stale: python -m devtools.readme")
    app = api_reference.build_app()
    document = app.openapi()
    scopes = api_reference.route_scopes(app)
    for path, operations in document["paths"].items():
        for method in operations:
            assert f"### `{method.upper()} {path}`" in section
            assert f"| {method.upper()} | [`{path}`]" in section
    assert scopes[("GET", "/api/health")] == "none"
    assert scopes[("POST", "/api/jobs")] == "admin" and scopes[("GET", "/api/jobs")] == "read"
    assert {key for key, scope in scopes.items() if scope == "none"} == api_reference.ANONYMOUS
    assert all(f"### {name} {{#schema-" in section for name in document["components"]["schemas"])


def test_a_route_without_a_token_stops_the_api_page_from_being_generated():
    from fastapi import FastAPI

    from common.api.deps import Admin

    app = FastAPI()

    @app.get("/api/open")
    def open_route() -> dict:
        return {}

    @app.post("/api/closed")
    def closed_route(caller: Admin) -> dict:
        return {}

    try:
        api_reference.route_scopes(app)
    except ValueError as error:
        assert "GET /api/open takes no token" in str(error)
    else:
        raise AssertionError("an anonymous route was documented")


def test_the_generator_checks_every_page_and_finds_none_stale():
    assert set(readme.PAGES) == {REFERENCE / "configuration.md",
                                 REFERENCE / "redis-and-queues.md", REFERENCE / "layout.md",
                                 REFERENCE / "api.md"}
    assert readme.main(["--check"]) == 0


def test_a_stale_table_is_rewritten_and_a_page_without_markers_refused():
    stale = "intro\n<!-- redis-keys:start -->\n| old |\n<!-- redis-keys:end -->\nafter\n"
    rendered = readme.render(stale, ("redis-keys",))
    assert "| old |" not in rendered and readme.redis_keys() in rendered
    assert rendered.startswith("intro\n") and rendered.endswith("after\n")
    try:
        readme.render("no markers here\n", ("layout",))
    except ValueError as error:
        assert "layout" in str(error)
    else:
        raise AssertionError("a page without markers was accepted")


def test_the_queue_table_names_every_queue_in_one_table():
    text = (REFERENCE / "redis-and-queues.md").read_text(encoding="utf-8")
    table = re.search(r"\| Queue \| Arguments \| Fed by \|\n((?:\|.*\|\n)+)", text)
    assert table, "the queue table is missing from docs/reference/redis-and-queues.md"
    rows = table.group(1)
    for queue in (*topology.WORK_QUEUES, topology.FAILED_QUEUE, topology.EXPIRED_QUEUE):
        assert f"`{queue}`" in rows
    assert "`hold.{ms}`" in rows


def test_the_commands_page_has_a_row_for_every_scrape_fleet_command():
    text = (REFERENCE / "commands.md").read_text(encoding="utf-8")
    rows = set(re.findall(r"^\| `scrape-fleet (\w+)", text, re.M))
    assert set(COMMANDS) - rows == set(), "commands docs/reference/commands.md does not list"
    assert rows - set(COMMANDS) == set(), "docs/reference/commands.md lists no such command"


def test_readme_gives_the_test_command_that_ci_runs():
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in text
    ci = (REPO_ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in ci


def test_readme_is_a_front_door_linking_to_every_page_of_the_docs_nav():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    nav = re.findall(r"^\s+- [^:]+: ([\w/.-]+\.md)$",
                     (REPO_ROOT / "mkdocs.yml").read_text(encoding="utf-8"), re.M)
    assert len(nav) >= 20
    pages = {f"docs/{page}" for page in nav} - {"docs/changelog.md"}
    linked = set(re.findall(r"\]\((docs/[\w/.-]+\.md)(?:#[\w-]+)?\)", text))
    assert pages - linked == set(), "pages of the docs' nav README does not link"
    assert [page for page in linked if not (REPO_ROOT / page).is_file()] == []


def test_every_rules_example_in_the_docs_loads_as_a_valid_rules_file(tmp_path):
    blocks = [block for page in sorted(DOCS.rglob("*.md"))
              for block in re.findall(r"```yaml\n(.*?)```", page.read_text(encoding="utf-8"),
                                      re.S)]
    rules_blocks = [block for block in blocks if block.lstrip().startswith("rules:")]
    assert len(rules_blocks) >= 2
    for n, block in enumerate(rules_blocks):
        path = tmp_path / f"rules{n}.yml"
        path.write_text(block)
        assert load_rules(f"@{path}")
