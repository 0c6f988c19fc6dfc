"""``python -m devtools.services``: start RabbitMQ and Redis, print their URLs, wait for ^C.

The printed ``export`` lines point other shells (or a hand-run worker) at the services.
"""

from __future__ import annotations

import logging
import signal
import threading

from devtools.services.fleet import fleet_services


def main() -> int:
    """``python -m devtools.services``: start the services, print their URLs, wait for ^C."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("pika").setLevel(logging.WARNING)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with fleet_services() as found:
        print(f"export RABBITMQ_URL='{found.rabbitmq_url}'")
        print(f"export REDIS_URL='{found.redis_url}'")
        if found.management_url:
            auth = found.management_auth
            print(f"# management: {found.management_url}"
                  + (f" (user {auth[0]}, password {auth[1]})" if auth else ""))
        print("# Ctrl-C or SIGTERM stops them.", flush=True)
        while not stop.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
