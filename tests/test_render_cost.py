"""The render bench's own arithmetic and bookkeeping (bench/render_cost.py), without a browser:
the farm's data, the process trees it measures, the flat-memory medians and the result check.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bench.render_cost import (
    RULES,
    Proc,
    TreeWatch,
    check_records,
    expected_fields,
    has_tag,
    page_data,
    quarter_medians,
    read_procs,
    render_urls,
    tenths,
    tree,
    write_render_farm,
)
from tests.helpers import wait_for


def test_page_data_carries_exactly_the_fields_the_rule_extracts():
    data = page_data(3, 17, 500, ["one.", "two.", "three."])
    assert {k: data[k] for k in ("name", "price", "items")} == expected_fields(3, 17)
    assert expected_fields(3, 17) == {"name": "product 3-17", "price": 17.5,
                                      "items": [f"item 3-17-{k}" for k in range(10)]}
    assert set(RULES["rules"][0]["fields"]) == {"name", "price", "items"}
    assert all(link.startswith("/r/") and link.endswith(".html") for link in data["links"])


def test_the_farm_writes_shells_without_content_and_serves_their_json_as_json(tmp_path):
    farm = write_render_farm(tmp_path, sites=2, pages=5)
    urls = render_urls(farm, 5)
    assert len(urls) == len(set(urls)) == 5
    assert urls[0].endswith("/r/1.html") and urls[1].endswith("/r/1.html")  # sites interleaved
    shell = (tmp_path / "site1" / "r" / "2.html").read_text()
    assert "fetch('/d/2.json')" in shell and "product" not in shell
    data = json.loads((tmp_path / "site1" / "d" / "2.json").read_text())
    assert data["name"] == "product 1-2"
    assert "application/json json;" in farm.conf_path.read_text()


def test_quarter_medians_compare_the_first_and_the_last_quarter():
    assert quarter_medians([1, 2, 3, 100, 100, 100, 7, 8]) == (1.5, 7.5)
    assert quarter_medians([5]) == (5, 5)
    with pytest.raises(ValueError):
        quarter_medians([])


def test_a_tree_is_a_process_and_its_descendants_only():
    procs = {pid: Proc(pid, parent, 0, 0, "x", 0.0)
             for pid, parent in [(1, 0), (10, 1), (11, 10), (12, 11), (20, 1), (21, 20)]}
    assert sorted(p.pid for p in tree(10, procs)) == [10, 11, 12]
    assert tree(99, procs) == []


def test_a_tree_watch_counts_a_grandchild_cpu_and_memory(tmp_path):
    burnt = tmp_path / "burnt"
    grandchild = ("import pathlib, time\nt = time.process_time()\n"
                  "while time.process_time() - t < 0.3: pass\n"
                  f"pathlib.Path({str(burnt)!r}).touch()\ntime.sleep(5)")
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                              f"subprocess.run([sys.executable, '-c', {grandchild!r}])"])
    try:
        watch = TreeWatch(child, "test")  # type: ignore[arg-type]
        assert wait_for(burnt.exists, 30)
        watch.sample(read_procs(), time.time())
        assert len(watch.cpu_by_proc) == 2
        assert watch.sampled_cpu_s >= 0.25  # the grandchild's busy loop
        assert watch.memory and watch.memory[0][1] > 0
    finally:
        child.kill()
        child.wait(10)


def test_check_records_counts_urls_with_several_results_and_wrong_fields(tmp_path):
    farm = write_render_farm(tmp_path, sites=1, pages=3)
    urls = render_urls(farm, 3)
    good = [{"url": u, "rendered": True, "data": expected_fields(0, n + 1)}
            for n, u in enumerate(urls)]
    bad = {"url": urls[0], "data": {"name": "Loading..."}}
    found = check_records([*good, bad], urls, farm)
    assert (found["urls_with_result"], found["urls_with_several"]) == (3, 1)
    assert (found["rendered"], found["wrong_fields"]) == (3, 1)


def test_a_process_is_found_by_the_tag_its_environment_inherited():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={"BENCH_RENDER_TAG": "1-render-0"})
    try:
        assert wait_for(lambda: has_tag(child.pid, {b"BENCH_RENDER_TAG=1-render-0"}), 10)
        assert not has_tag(child.pid, {b"BENCH_RENDER_TAG=1-render-1"})
    finally:
        child.kill()
        child.wait(10)
    assert not has_tag(child.pid, {b"BENCH_RENDER_TAG=1-render-0"})  # gone


def test_tenths_give_the_shape_of_a_series():
    assert tenths(list(range(100))) == [4, 14, 24, 34, 44, 54, 64, 74, 84, 94]
    assert tenths([7.0, 9.0]) == [7, 9]
