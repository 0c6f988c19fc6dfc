from __future__ import annotations

import re
from pathlib import Path

from common.broker import topology
from common.work.rules_file import load_rules
from devtools import readme

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}:start -->\n(.*?)\n<!-- {name}:end -->", text, re.S)
    assert found, f"README lost its {name} markers"
    return found.group(1)


def test_readme_configuration_table_is_generated_from_the_settings():
    assert _section("config-table") == readme.config_table(), (
        "README's config table is stale: python -m devtools.readme")


def test_readme_layout_matches_the_tree():
    section = _section("layout")
    assert section == readme.layout(), "README's layout is stale: python -m devtools.readme"
    on_disk = {str(p.relative_to(README.parent)) for p in README.parent.glob("common/*/*.py")
               if p.name != "__init__.py"}
    listed = set(re.findall(r"`(common/\w+/\w+\.py)`", section))
    assert listed == on_disk
    rooms = {p.parent.name for p in README.parent.glob("common/*/__init__.py")}
    assert rooms == set(readme.ROOMS), "a room of common/ is missing from devtools.readme.ROOMS"


def test_readme_key_list_is_generated_from_the_key_schema():
    section = _section("redis-keys")
    assert section == readme.redis_keys(), "README's key list is stale: python -m devtools.readme"
    for key in ("crawled_urls:", "done:", "workers:", "crawl:pages:", "robots:lock:"):
        assert f"`{key}" in section


def test_readme_queue_table_names_every_queue_in_one_table():
    text = README.read_text(encoding="utf-8")
    table = re.search(r"\| Queue \| Arguments \| Fed by \|\n((?:\|.*\|\n)+)", text)
    assert table, "README's queue table is missing"
    rows = table.group(1)
    for queue in (*topology.WORK_QUEUES, topology.FAILED_QUEUE, topology.EXPIRED_QUEUE):
        assert f"`{queue}`" in rows
    assert "`hold.{ms}`" in rows


def test_readme_test_command_is_what_ci_runs():
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in ci


def test_every_rules_example_in_the_readme_loads_as_a_valid_rules_file(tmp_path):
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    rules_blocks = [block for block in blocks if block.lstrip().startswith("rules:")]
    assert len(rules_blocks) >= 2
    for n, block in enumerate(rules_blocks):
        path = tmp_path / f"rules{n}.yml"
        path.write_text(block)
        assert load_rules(f"@{path}")
