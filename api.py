"""The control plane (docs: the OpenAPI page at /api/docs); `scrape-fleet api` as a root script.

    python api.py [--host H] [--port P]                        # serve on API_HOST:API_PORT
    python api.py token create NAME --scope read|admin [--ttl S]   # prints the token once
    python api.py token list | token revoke NAME|TOKEN
    python api.py user add NAME --scope read|admin < password.txt
"""

from __future__ import annotations

from common.api.cli import api_main
from common.ops import cli

if __name__ == "__main__":
    cli.run(api_main)
