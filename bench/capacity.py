"""How much Redis and RabbitMQ memory a page and a queued URL take: the figures behind the
"result record bytes" and "pages per GB of Redis" rows and README's capacity table.

* :func:`stream_figures`, after a fleet round (bench/crawl_rounds.py): every result record's
  JSON size (XRANGE), the ``results`` stream's own memory (``MEMORY USAGE results SAMPLES 0``,
  so listpack and radix-tree overhead included) per entry, and a sample of the response
  cache's ``content:{url}`` entries, which live CACHE_TTL_S after their fetch.
* :func:`queue_memory`: a queue's messages and memory from ``rabbitmqctl list_queues``, when
  the bench started the broker itself.
* ``python -m bench.capacity [--messages 100000]``: a fresh local RabbitMQ and Redis, that
  many farm-like URLs through the producer (canonicalise, dedupe, confirmed publish), then
  the queue's memory per message and the node's memory growth.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis  # noqa: E402

from bench.figures import percentile  # noqa: E402
from common.broker import topology  # noqa: E402
from devtools.services import FleetServices  # noqa: E402

GIB = 1 << 30
CACHE_SAMPLE = 200


def stream_figures(client: redis.Redis, stream: str = "results") -> dict[str, Any]:
    """Record sizes (bytes of JSON, one per entry) and the stream's memory per entry."""
    sizes: list[int] = []
    cursor = "-"
    while True:
        entries = client.xrange(stream, min=cursor, max="+", count=1000)
        if cursor != "-":
            entries = entries[1:]  # the first entry is the last one of the previous batch
        if not entries:
            break
        sizes.extend(len(fields[b"json"]) for _id, fields in entries)
        cursor = entries[-1][0].decode()
    entries_n = int(client.xlen(stream))
    stream_bytes = int(client.memory_usage(stream, samples=0) or 0)
    cache: list[int] = []
    for key in client.scan_iter(match="content:*", count=1000):
        cache.append(int(client.memory_usage(key, samples=0) or 0))
        if len(cache) >= CACHE_SAMPLE:
            break
    return {
        "record_sizes": sizes,
        "stream_entries": entries_n,
        "stream_bytes": stream_bytes,
        "cache_entries_sampled": len(cache),
        "cache_bytes_per_entry": sum(cache) / len(cache) if cache else None,
    }


def record_summary(sizes: list[int]) -> dict[str, Any]:
    """Median, p99 and max of record sizes."""
    if not sizes:
        return {"records": 0, "record_bytes_p50": None, "record_bytes_p99": None,
                "record_bytes_max": None}
    return {"records": len(sizes), "record_bytes_p50": percentile(sizes, 50),
            "record_bytes_p99": percentile(sizes, 99), "record_bytes_max": max(sizes),
            "record_bytes_mean": round(sum(sizes) / len(sizes), 1)}


def pages_per_gib(stream_per_record: float | None, seen_per_url: float | None) -> float | None:
    """Pages whose outcome 1 GiB of Redis holds: the stream entry plus the seen-set member
    plus the done mark (same layout as the seen-set). The response cache is not included:
    its entries expire CACHE_TTL_S after the fetch, so it costs pages/s × TTL × entry size
    whatever the number of pages kept."""
    if not stream_per_record or not seen_per_url:
        return None
    return GIB / (stream_per_record + 2 * seen_per_url)


def queue_memory(services: FleetServices, queue: str) -> dict[str, int] | None:
    """``rabbitmqctl list_queues``'s messages, memory and message bytes of ``queue``; None
    when the broker was not started here (no rabbitmqctl for it)."""
    node = services.rabbitmq
    if node is None:
        return None
    try:
        out = node.ctl("list_queues", "-q", "--no-table-headers", "name", "messages",
                       "memory", "message_bytes", "message_bytes_ram").stdout
    except RuntimeError:  # ServicesUnavailable: a busy node timed out; the figure is optional
        return None
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[0] == queue:
            messages, memory, body, in_ram = (int(v) for v in parts[1:])
            return {"messages": messages, "memory": memory, "message_bytes": body,
                    "message_bytes_ram": in_ram}
    return None


def node_memory(services: FleetServices) -> int | None:
    """The broker node's total Erlang memory (``erlang:memory(total)``)."""
    if services.rabbitmq is None:
        return None
    return int(services.rabbitmq.ctl("eval", "erlang:memory(total).").stdout.strip())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="RabbitMQ memory per queued URL.")
    parser.add_argument("--messages", type=int, default=100_000)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from common.core.config import load_settings
    from common.intake.producer import Producer
    from devtools.services import fleet_services, reset_state

    with fleet_services(env={}) as services:
        settings = load_settings({"RABBITMQ_URL": services.rabbitmq_url,
                                  "REDIS_URL": services.redis_url, "LOG_LEVEL": "WARNING"})
        client = redis.Redis.from_url(services.redis_url)
        reset_state(services.rabbitmq_url, services.redis_url)  # declares the queues
        empty = queue_memory(services, topology.NORMAL_QUEUE)
        node_before = node_memory(services)
        urls = [f"http://127.0.0.{2 + i % 10}:8080/p/{i}.html" for i in range(args.messages)]
        with Producer(settings, client) as producer:
            summary = producer.submit(urls)
        time.sleep(1)
        full = queue_memory(services, topology.NORMAL_QUEUE)
        node_after = node_memory(services)
        redis_used = int(client.info("memory")["used_memory"])
    if not (empty and full and node_before and node_after):
        print("rabbitmqctl gave no figures")
        return 1
    n = full["messages"]
    per_message = (full["memory"] - empty["memory"]) / n
    node_per_message = (node_after - node_before) / n
    print(f"{summary.new:,} URLs published; {topology.NORMAL_QUEUE}: {n:,} messages, "
          f"{full['message_bytes'] / n:.0f} bytes of body each ({full['message_bytes_ram']:,} "
          f"bytes of bodies in RAM)")
    print(f"queue process memory: {full['memory']:,} bytes = {per_message:.0f} bytes/message; "
          f"node memory growth {node_per_message:.0f} bytes/message; "
          f"{GIB / max(per_message, node_per_message):,.0f} messages per GiB")
    print(f"Redis used_memory after the seen-set took them: {redis_used:,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
