"""The settings a local fleet runs with, kept in its directory across ``down``/``up`` until
changed, and ``scrape-fleet config``, which shows and changes them.

Every ``up`` runs with DIR/settings.env (mode 0600: a setting may hold a password, such as
POSTGRES_URL's), updated by what that ``up`` was given: a setting in the environment, then
``--set KEY=VALUE``, then ``--allow-network CIDR`` (added to FETCH_ALLOW_NETWORKS); the
result is kept for the next ``up``. ``config set KEY=VALUE ...`` and ``config unset KEY ...``
change the file; they take effect at the next ``up``. Every name and value is checked against
:data:`~common.core.knobs.KNOBS` first: an unknown name or a value that does not parse is a
ConfigError naming the variable (exit 2), and nothing is written. What local mode decides
itself (the connection, SINK_DIR: :data:`~common.ops.fleet_dir.LOCAL_VARIABLES`) and
per-process settings cannot be set.
"""

from __future__ import annotations

import argparse
import difflib
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path

from common.core.config import KNOBS, Settings, load_settings, refuse_placeholder
from common.core.errors import ConfigError
from common.core.knobs import Knob
from common.ops import cli
from common.ops.fleet_dir import LOCAL_VARIABLES, PER_PROCESS, FleetDir, default_dir

#: The settings local mode keeps for the user, by variable name.
SETTABLE: dict[str, Knob] = {knob.env: knob for knob in KNOBS
                             if knob.env not in (*LOCAL_VARIABLES, *PER_PROCESS)}
#: Shown at ``up`` even at their defaults: what decides what a crawl may reach and how fast.
SHOWN_ALWAYS = ("FETCH_ALLOW_NETWORKS", "RATE_LIMIT", "CRAWL_ENABLED", "CRAWL_MAX_DEPTH")
ALLOW_NETWORKS = "FETCH_ALLOW_NETWORKS"


def knob_for(name: str) -> Knob:
    """The knob a user may set under ``name``.

    Raises:
        ConfigError: naming ``name``: not a setting (with the closest one), or one that local
            mode decides itself.
    """
    if name in LOCAL_VARIABLES:
        raise ConfigError(f"{name} is decided by local mode (`up` picks the connections and "
                          "SINK_DIR): it cannot be set")
    if name in PER_PROCESS:
        raise ConfigError(f"{name} is a setting of one process, not of the fleet")
    if name not in SETTABLE:
        close = difflib.get_close_matches(name.upper(), SETTABLE, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise ConfigError(f"{name} is not a setting{hint} (docs/reference/configuration.md "
                          "lists them)")
    return SETTABLE[name]


def check(name: str, value: str) -> None:
    """Raise a ConfigError naming ``name`` when ``value`` is not a value of it (never showing
    a password)."""
    knob = knob_for(name)
    if value == "":
        return  # empty is unset: the default applies
    try:
        parsed = knob.parse(value)
    except ValueError as exc:
        raise knob.invalid(value, exc) from None
    refuse_placeholder(knob, parsed)


def assignment(text: str) -> tuple[str, str]:
    """``KEY=VALUE``, checked (:func:`check`)."""
    name, equals, value = text.partition("=")
    if not equals:
        raise ConfigError(f"expected KEY=VALUE, got {name!r}")
    check(name, value)
    return name, value


def check_all(values: Mapping[str, str]) -> Settings:
    """Every value checked (:func:`check`), then all of them together as ``load_settings``
    reads them."""
    for name, value in values.items():
        check(name, value)
    return load_settings(values)


def from_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The settable variables set (non-empty) in ``environ``."""
    return {name: environ[name] for name in SETTABLE if environ.get(name)}


def add_networks(current: str, added: Iterable[str]) -> str:
    """FETCH_ALLOW_NETWORKS ``current`` with ``added`` CIDRs appended (each once).

    Only private networks (loopback, RFC 1918, link-local, IPv6 ULA) are taken: public
    addresses are allowed already, and a network holding them (``0.0.0.0/0``, a typo) would
    open every private one too. ``--set FETCH_ALLOW_NETWORKS=...`` takes any.

    Raises:
        ConfigError: naming FETCH_ALLOW_NETWORKS and the CIDR that does not parse or is not
            private.
    """
    networks = [part.strip() for part in current.split(",") if part.strip()]
    for cidr in added:
        try:
            network = ipaddress.ip_network(cidr.strip(), strict=False)
        except ValueError as exc:
            raise ConfigError(f"{ALLOW_NETWORKS}: --allow-network {cidr!r} is not a CIDR "
                              f"network ({exc})") from None
        if not network.is_private:
            raise ConfigError(f"{ALLOW_NETWORKS}: --allow-network {cidr!r} holds public "
                              "addresses, which are allowed already: give the private network "
                              "of your site (127.0.0.0/8 this machine, 192.168.0.0/16, "
                              "10.0.0.0/8...)")
        if str(network) not in networks:
            networks.append(str(network))
    return ",".join(networks)


def run_settings(stored: Mapping[str, str], environ: Mapping[str, str],
                 overrides: Iterable[tuple[str, str]] = (),
                 networks: Iterable[str] = ()) -> dict[str, str]:
    """What ``up`` runs with and keeps: ``stored``, then the environment's, then
    ``overrides`` (``--set``), then ``networks`` (``--allow-network``); an empty value unsets.

    Raises:
        ConfigError: naming the first variable whose name or value is wrong.
    """
    values = {**stored, **from_environment(environ), **dict(overrides)}
    if networks:
        values[ALLOW_NETWORKS] = add_networks(values.get(ALLOW_NETWORKS, ""), networks)
    values = {name: value for name, value in values.items() if value != ""}
    check_all(values)
    return values


def described(values: Mapping[str, str], fleet: FleetDir, *, defaults: bool = True) -> list[str]:
    """One line a setting, passwords shown as where they are; with ``defaults``, the
    settings of :data:`SHOWN_ALWAYS` that are not set, with their defaults."""
    lines = []
    for name, value in values.items():
        knob = SETTABLE.get(name)
        shown = knob.show(value) if knob else value
        where = f"  (password in {fleet.settings_file})" if shown != value else ""
        lines.append(f"  {name}={shown}{where}")
    lines += [f"  {name}={SETTABLE[name].default}  (default)" for name in SHOWN_ALWAYS
              if defaults and name not in values]
    return lines


def running_text(fleet: FleetDir) -> str:
    """When a change takes effect, as ``config set`` says it."""
    if fleet.stopped_servers():
        return "this takes effect at the next `scrape-fleet up`"
    return ("this takes effect at the next `scrape-fleet up`: the running fleet keeps its "
            "settings until `scrape-fleet down` and `up` (a restart)")


def config_args(argv: list[str] | None, prog: str | None) -> argparse.Namespace:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--dir", type=Path, metavar="DIR",
                        help=f"the fleet's directory (default $SCRAPE_FLEET_DIR, else "
                             f"{default_dir({})})")
    parser = argparse.ArgumentParser(
        prog=prog, description="Show or change the settings every `scrape-fleet up` runs "
                               "with (kept in DIR/settings.env across down/up).")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("show", parents=[parent], help="the settings the next `up` runs with")
    change = commands.add_parser("set", parents=[parent],
                                 help="set settings for the next `up` (docs/reference/configuration.md)")
    change.add_argument("assignments", nargs="+", metavar="KEY=VALUE")
    remove = commands.add_parser("unset", parents=[parent], help="back to the default")
    remove.add_argument("names", nargs="+", metavar="KEY")
    args = parser.parse_args(argv)
    args.fleet = FleetDir((args.dir or default_dir()).expanduser().resolve())
    return args


def config_main(settings: Settings, argv: list[str] | None = None,
                prog: str | None = None) -> int:
    """``scrape-fleet config show|set|unset``."""
    args = config_args(argv, prog)
    fleet: FleetDir = args.fleet
    stored = fleet.read_settings()
    if args.command == "show":
        print(f"settings for the next `scrape-fleet up` ({fleet.settings_file}):")
        print("\n".join(described(stored, fleet)))
        running = {k: v for k, v in fleet.read_env().items() if k in SETTABLE}
        if not fleet.stopped_servers() and running != stored:
            print("the running fleet runs with these until `scrape-fleet down` and `up`:")
            print("\n".join(described(running, fleet)))
        return cli.EXIT_OK
    if args.command == "set":
        changes = dict(assignment(text) for text in args.assignments)
        values = {k: v for k, v in {**stored, **changes}.items() if v != ""}
    else:
        for name in args.names:
            knob_for(name)
        changes = {name: "" for name in args.names}
        values = {k: v for k, v in stored.items() if k not in changes}
    check_all(values)
    fleet.create()
    fleet.write_settings(values)
    shown = described({k: v for k, v in changes.items() if v != ""}, fleet, defaults=False)
    unset = [f"  {name} unset (its default: {SETTABLE[name].default!r})"
             for name, value in changes.items() if value == ""]
    print("\n".join([f"saved in {fleet.settings_file}:", *shown, *unset,
                     running_text(fleet)]))
    return cli.EXIT_OK

