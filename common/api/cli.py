"""``scrape-fleet api``: serve the control plane, and manage who may call it.

    scrape-fleet api [--host H] [--port P]              # serve (API_HOST:API_PORT)
    scrape-fleet api token create NAME --scope read|admin [--ttl S]
    scrape-fleet api token list | token revoke NAME|TOKEN
    scrape-fleet api user add NAME --scope read|admin   # the password on stdin or at a prompt

``token create`` prints the token once, alone on standard output (``TOKEN=$(scrape-fleet api
token create ci --scope read)``): only its SHA-256 is stored. ``token list`` shows names,
scopes and times, never a token. A password is never an argument (``ps`` and shell history
would keep it): ``user add`` reads it from standard input when that is not a terminal, else
asks for it twice with getpass.
"""

from __future__ import annotations

import argparse
import getpass
import sys
import time

from common.api.auth import SCOPES, Tokens
from common.core.config import Settings
from common.ops import cli
from common.store.connection import connect_redis


def _args(settings: Settings, argv: list[str] | None, prog: str | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default=settings.api_host,
                        help=f"address to listen on (default API_HOST, {settings.api_host})")
    parser.add_argument("--port", type=int, default=settings.api_port,
                        help=f"port (default API_PORT, {settings.api_port})")
    commands = parser.add_subparsers(dest="command")
    token = commands.add_parser("token", help="create, list or revoke API tokens")
    token_commands = token.add_subparsers(dest="action", required=True)
    create = token_commands.add_parser("create", help="a new token, printed once")
    create.add_argument("name")
    create.add_argument("--scope", choices=SCOPES, required=True)
    create.add_argument("--ttl", type=cli.positive_int, metavar="S",
                        help="expires after S seconds (default: never)")
    token_commands.add_parser("list", help="names, scopes, created, expires (never tokens)")
    revoke = token_commands.add_parser("revoke", help="a token, or every token of a name")
    revoke.add_argument("name_or_token", metavar="NAME|TOKEN")
    user = commands.add_parser("user", help="users who log in to the web UI")
    user_commands = user.add_subparsers(dest="action", required=True)
    add = user_commands.add_parser("add", help="add a user, or change one's password/scope")
    add.add_argument("name")
    add.add_argument("--scope", choices=SCOPES, required=True)
    add.add_argument("--password", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if getattr(args, "password", None) is not None:
        add.error("--password is refused: a password on the command line is seen by ps and "
                  "kept in shell history; give it on standard input or at the prompt")
    return args


def _when(stamp: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp)) if stamp else "never"


def _password() -> str:
    """The new password: standard input's first line, or asked twice at a terminal."""
    if not sys.stdin.isatty():
        return sys.stdin.readline().removesuffix("\n").removesuffix("\r")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise ValueError("the two passwords differ")
    return first


def api_main(settings: Settings, argv: list[str] | None = None, prog: str | None = None) -> int:
    """``scrape-fleet api``."""
    args = _args(settings, argv, prog)
    if args.command is None:
        import uvicorn

        from common.api.app import create_app

        uvicorn.run(create_app(settings), host=args.host, port=args.port,
                    log_level=settings.log_level.lower())
        return cli.EXIT_OK
    tokens = Tokens(connect_redis(settings))
    try:
        if args.command == "token" and args.action == "create":
            token = tokens.create(args.name, args.scope, args.ttl or 0)
            print(token)
            print(f"token {args.name!r} ({args.scope}) created: shown once, stored hashed",
                  file=sys.stderr)
        elif args.command == "token" and args.action == "list":
            rows = tokens.list()
            print(f"{'NAME':<30} {'SCOPE':<6} {'CREATED':<21} {'EXPIRES':<21} USER")
            for row in rows:
                print(f"{cli.escape_controls(row['name']):<30} {row['scope']:<6} "
                      f"{_when(row['created']):<21} {_when(row.get('expires', 0)):<21} "
                      f"{cli.escape_controls(row.get('user', ''))}")
        elif args.command == "token":
            gone = tokens.revoke(args.name_or_token)
            print(f"revoked {gone} token(s)")
            return cli.EXIT_OK if gone else cli.EXIT_PARTIAL
        else:
            tokens.add_user(args.name, _password(), args.scope)
            print(f"user {args.name!r} ({args.scope}) saved")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    return cli.EXIT_OK
