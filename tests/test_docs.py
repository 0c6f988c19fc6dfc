from __future__ import annotations

import re
from pathlib import Path

from common.config import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_configuration_table_is_generated_from_the_settings():
    text = README.read_text(encoding="utf-8")
    table = re.search(r"<!-- config-table:start -->\n(.*?)\n<!-- config-table:end -->", text,
                      re.S)
    assert table, "README lost its config-table markers"
    assert table.group(1).strip() == markdown_table().strip(), (
        "README.s table is stale: python -m common.config --update-readme")


def test_readme_test_command_is_what_ci_runs():
    text = README.read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in text
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "bash scripts/test.sh" in ci
