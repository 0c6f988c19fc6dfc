"""One queue's ceiling with publisher confirms and consumer acks: quorum on a 3-node cluster,
classic on one node, on this machine.

    .venv/bin/python -m bench.quorum_rate [--messages 30000] [--body-bytes 200] [--types quorum,classic]

For each queue type, a fresh local broker (devtools/services: :class:`LocalRabbitCluster` of 3
nodes for ``quorum``, one :class:`LocalRabbitMQ` for ``classic``) and one durable queue
declared the way the fleet declares its work queues (common/broker/topology.py,
:func:`~common.broker.topology.queue_arguments`). Then, at the same time, in two processes:

* a publisher, as the producer publishes: persistent messages of ``--body-bytes`` (a work
  message is ~150-250 bytes) through :class:`~common.broker.publisher.ConfirmingPublisher`,
  batches of 1,000 (PRODUCER_BATCH), each batch's confirms awaited before the next;
* a consumer, as a worker consumes: prefetch 16 (the default 2 x 8), every delivery acked,
  the acks batched per event-loop turn with ``multiple=True`` (common/work/acks.py).

Reported: messages/s from the first publish to the last ack (the pair's throughput, i.e. the
queue's ceiling for a fleet whose producer and workers keep up), publish-only msgs/s and the
broker's CPU seconds per 1,000 messages. Publisher and consumer connect to the same node
(the queue's leader, as the fleet's clients do with the first address). Nothing is compared
with a baseline: the figures feed NOTES' capacity section.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika  # noqa: E402

from bench.procstat import proc_cpu_s  # noqa: E402
from common.broker import topology  # noqa: E402
from common.broker.publisher import ConfirmingPublisher  # noqa: E402
from devtools.services import LocalRabbitMQ  # noqa: E402
from devtools.services.rabbitmq_cluster import LocalRabbitCluster  # noqa: E402

QUEUE = "bench_ceiling"
BATCH = 1000
PREFETCH = 16


def _publish(url: str, messages: int, body: bytes, started: Any, done: Any) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    publisher = ConfirmingPublisher(connection)
    started.wait()
    t0 = time.perf_counter()
    failed = 0
    for first in range(0, messages, BATCH):
        for n in range(first, min(first + BATCH, messages)):
            publisher.publish("", QUEUE, body, token=n)
        failed += sum(not confirm.ok for confirm in publisher.wait())
    done.put(("publish", time.perf_counter() - t0, failed))
    connection.close()


def _consume(url: str, messages: int, started: Any, done: Any) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    seen = 0
    last_tag = 0

    def on_message(_channel: Any, method: Any, _props: Any, _body: bytes) -> None:
        nonlocal seen, last_tag
        seen += 1
        last_tag = method.delivery_tag

    channel.basic_consume(QUEUE, on_message)
    started.wait()
    t0 = time.perf_counter()
    acked = 0
    while seen < messages:
        connection.process_data_events(time_limit=0.01)
        if last_tag > acked:  # one multiple-ack per loop turn, as the worker's ledger does
            channel.basic_ack(last_tag, multiple=True)
            acked = last_tag
    done.put(("consume", time.perf_counter() - t0, seen))
    connection.close()


def _run(url: str, queue_type: str, messages: int, body_bytes: int,
         broker_pids: list[int]) -> dict[str, Any]:
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_delete(QUEUE)
    spec = topology.QueueSpec(QUEUE, {"x-message-ttl": topology.HOUR_MS,
                                      "x-dead-letter-exchange": topology.EXPIRED_EXCHANGE})
    arguments = topology.queue_arguments(spec, queue_type)
    if queue_type == topology.QUORUM:
        arguments["x-delivery-limit"] = topology.DELIVERY_LIMIT
    channel.queue_declare(QUEUE, durable=True, arguments=arguments)
    body = json.dumps({"url": "https://example.com/" + "x" * max(0, body_bytes - 40)}).encode()
    context = multiprocessing.get_context("spawn")
    started, done = context.Event(), context.Queue()
    workers = [context.Process(target=_publish, args=(url, messages, body, started, done)),
               context.Process(target=_consume, args=(url, messages, started, done))]
    for worker in workers:
        worker.start()
    time.sleep(2.0)  # both connected and consuming
    cpu_before = sum(proc_cpu_s(pid) or 0.0 for pid in broker_pids)
    started.set()
    outcome = {kind: (elapsed, n) for kind, elapsed, n in (done.get(timeout=600),
                                                           done.get(timeout=600))}
    cpu_s = sum(proc_cpu_s(pid) or 0.0 for pid in broker_pids) - cpu_before
    for worker in workers:
        worker.join(timeout=30)
    channel.queue_delete(QUEUE)
    connection.close()
    publish_s, failed = outcome["publish"]
    consume_s, _seen = outcome["consume"]
    return {"queue_type": queue_type, "messages": messages, "body_bytes": len(body),
            "msgs_per_s": round(messages / max(publish_s, consume_s)),
            "publish_msgs_per_s": round(messages / publish_s), "failed_publishes": failed,
            "broker_cpu_s_per_1000": round(1000 * cpu_s / messages, 3)}


def _beam_pids(data_dirs: list[Path]) -> list[int]:
    pids = []
    for directory in data_dirs:
        try:
            pids.append(int((directory / "pid").read_text().strip()))
        except (OSError, ValueError):
            continue
    return pids


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--body-bytes", type=int, default=200)
    parser.add_argument("--types", default="quorum,classic")
    args = parser.parse_args(argv)
    for queue_type in args.types.split(","):
        if queue_type == topology.QUORUM:
            with LocalRabbitCluster() as cluster:
                pids = _beam_pids([node.dir for node in cluster.nodes if node.dir])
                row = _run(cluster.urls[0], queue_type, args.messages, args.body_bytes, pids)
                row["nodes"] = 3
        else:
            with LocalRabbitMQ() as node:
                pids = _beam_pids([node.dir] if node.dir else [])
                row = _run(node.url, queue_type, args.messages, args.body_bytes, pids)
                row["nodes"] = 1
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
