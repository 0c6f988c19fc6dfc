"""The commands' side of local mode: before ``status``, ``produce``, ``export``, ``dlq``... run
with no connection variable set, point them at the local fleet ``up`` started, or, when that
fleet is down, stop at once with what to type instead of retrying ``localhost`` for 30 s.

``export`` is the exception: with the fleet down it reads the files sink's parts in the
fleet's ``results/`` alone (``--files-only``), which hold every result, since ``down`` waits
until the sink has written them.
"""

from __future__ import annotations

import sys
from collections.abc import MutableMapping

from common.ops import cli
from common.ops.fleet_dir import LocalFleetDown, use_local_fleet

#: Options after which a command prints and exits without connecting.
_HELP = ("-h", "--help")


def point_at_local_fleet(command: str, argv: list[str],
                         environ: MutableMapping[str, str]) -> list[str]:
    """Use the local fleet's settings for ``command`` (:func:`use_local_fleet`).

    Returns:
        The command's arguments: ``argv``, or for an ``export`` while the fleet is down,
        ``--files-only --sink-dir RESULTS`` before them (a ``--sink-dir`` of the user's, later,
        wins).

    Raises:
        SystemExit: 3, the fleet is down and ``command`` needs it; the message says so on
            stderr.
    """
    try:
        use_local_fleet(environ)
    except LocalFleetDown as down:
        if any(word in _HELP for word in argv):
            return argv
        if command == "export" and "--follow" not in argv:
            return ["--files-only", "--sink-dir", str(down.fleet.results), *argv]
        print(f"error: {cli.escape_controls(str(down))}", file=sys.stderr)
        sys.exit(cli.EXIT_UNAVAILABLE)
    return argv
