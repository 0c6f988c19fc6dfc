"""fleet.env keeps any value a setting can hold: written by ``up``, read back unchanged by every
command (and still sourceable by a POSIX shell)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from common.ops.fleet_dir import FleetDir

HOSTILE = {
    "EXTRACT_RULES": '[\n  {"name": "it\'s", "host": "shop.example",\n'
                     '   "fields": {"price": {"css": "p", "regex": "(\\\\d+) \\\\$ #1 a=b"}}}\n]\n',
    "QUOTES": "single ' double \" back ` end",
    "HASH": "#not a comment # either",
    "EQUALS": "a=b==c=",
    "BACKSLASHES": "\\ \\\\ \\n \\' \\\"",
    "DOLLARS": "$HOME ${HOME} $(id) `id` $$",
    "SPACES": "  leading and trailing  ",
    "EMPTY": "",
    "CRLF": "one\r\ntwo\rthree\n",
    "UNICODE": "caf\u00e9 \u2028 line\u2029 sep \u00a0 nbsp",
    "TABS": "\tx\ty\t",
}


def test_every_hostile_value_written_to_fleet_env_reads_back_unchanged(tmp_path):
    fleet = FleetDir(tmp_path)
    fleet.create()
    fleet.write_env(HOSTILE)
    assert fleet.read_env() == HOSTILE
    assert oct(fleet.env_file.stat().st_mode & 0o777) == "0o600"


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_a_shell_sourcing_fleet_env_gets_the_same_values(tmp_path):
    fleet = FleetDir(tmp_path)
    fleet.create()
    fleet.write_env(HOSTILE)
    script = f'set -a; . "{fleet.env_file}"; set +a; exec env -0'
    out = subprocess.run(["sh", "-c", script], capture_output=True, check=True, timeout=10,
                         env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    pairs = dict(entry.split("=", 1) for entry in out.stdout.decode().split("\0") if entry)
    assert {key: pairs.get(key) for key in HOSTILE} == HOSTILE
