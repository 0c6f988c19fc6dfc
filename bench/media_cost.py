"""What downloading costs: assets/s, MiB/s and CPU per MiB of ``worker.py --media`` into the
directory store or an S3 store (issue 30).

    .venv/bin/python -m bench.media_cost [--assets 400] [--size 256] [--big 4] [--big-mb 16]
        [--workers 1] [--concurrency 8] [--store file|s3] [--profile] [--json PATH] [--keep]

The site: ``--assets`` files of ``--size`` KiB (``/a/N.jpg``, served as image/jpeg, asked for
as kind ``image``) and ``--big`` files of ``--big-mb`` MiB (``/v/N.mp4``, video/mp4, kind
``video``), random bytes (nothing to compress), each its own (one object per asset), in a
temp docroot served by nginx on loopback (devtools/nginx_site.py).

The fleet: RabbitMQ and Redis (devtools.services, as the other bench modules start them) and
``--workers`` download workers (``worker.py --media``, WORKER_CONCURRENCY=``--concurrency``,
RATE_LIMIT 100000/second so the site's turn never binds), MEDIA_STORE a temp directory or, with
``--store s3``, a bucket on moto's S3 server (devtools/s3_server.py; moto stands in for the
store, so its CPU is reported apart, never in the worker's). The workers start on empty queues;
once each consumes, every asset is published as a media request (common.intake.producer) and
the clock runs until the ``assets`` stream holds one record per asset (or a failure each).

Measured from the kernel (bench/procstat.py): each worker's CPU (utime + stime of the process
and its children, /proc) from the moment it consumed to the last record, so start-up is not
counted; its peak RSS (VmHWM); nginx's, moto's and Redis's CPU over the same window. Checked:
one record per URL, each record's sha256 and size the file's, and every stored object read
back from the store with that hash. The floor: the bench process's own CPU to sha256, write
(and fsync) and copy a MiB on this machine, what the worker cannot avoid per MiB in the
directory store (hash, spool write, copy into the store). ``--profile``: py-spy on each worker
(bench/.venv, from bench/run.sh), the functions where its samples fall.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika  # noqa: E402
import redis  # noqa: E402

from bench.procstat import Watched, children_of, group_cpu_s, proc_cpu_s  # noqa: E402
from bench.shared import REPO_ROOT, find_py_spy, fleet_env, log, summarise_profile  # noqa: E402
from common.broker import topology  # noqa: E402
from common.core.config import load_settings  # noqa: E402
from common.intake.producer import Producer  # noqa: E402
from common.media.store import open_store  # noqa: E402
from common.store.keys import ASSETS_STREAM  # noqa: E402
from devtools.nginx_site import NginxSite  # noqa: E402
from devtools.s3_server import S3Server  # noqa: E402
from devtools.services import fleet_services, reset_state  # noqa: E402

MIB = 1024 * 1024
BUCKET = "bench-media"
#: (directory, extension, media type, kind) of the small and the big files.
SMALL = ("a", "jpg", "image/jpeg", "image")
BIG = ("v", "mp4", "video/mp4", "video")
PAGE = "http://localhost/bench-media-page.html"


@dataclass(frozen=True)
class Asset:
    path: str  # as served: /a/12.jpg
    size: int
    sha256: str
    media_type: str
    kind: str


# -- the site ---------------------------------------------------------------------------------

def write_docroot(root: Path, *, assets: int, size_kb: int, big: int, big_mb: int,
                  seed: int = 30) -> list[Asset]:
    """``assets`` files of ``size_kb`` KiB and ``big`` of ``big_mb`` MiB under ``root``, each
    its own random bytes, and a robots.txt that allows all; returns what each must hash to."""
    rng = random.Random(seed)
    out = []
    for (folder, ext, media_type, kind), count, size in ((SMALL, assets, size_kb * 1024),
                                                          (BIG, big, big_mb * MIB)):
        (root / folder).mkdir(parents=True, exist_ok=True)
        for n in range(count):
            body = rng.randbytes(size)
            path = f"/{folder}/{n}.{ext}"
            (root / path.lstrip("/")).write_bytes(body)
            out.append(Asset(path, size, hashlib.sha256(body).hexdigest(), media_type, kind))
    (root / "robots.txt").write_text("User-agent: *\nAllow: /\n")
    return out


def site_config() -> str:
    """nginx's server-block lines: the media types of the files, by extension."""
    types = " ".join(f"{media_type} {ext};" for _d, ext, media_type, _k in (SMALL, BIG))
    return f"        types {{ {types} text/plain txt; }}\n"


# -- measuring ---------------------------------------------------------------------------------

def tree_cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its live children (0 when gone)."""
    return (proc_cpu_s(pid) or 0.0) + sum(proc_cpu_s(c) or 0.0 for c in children_of(pid))


def consumers(rabbitmq_url: str, queues: Sequence[str]) -> dict[str, int]:
    connection = pika.BlockingConnection(pika.URLParameters(rabbitmq_url))
    try:
        channel = connection.channel()
        return {q: channel.queue_declare(queue=q, passive=True).method.consumer_count
                for q in queues}
    finally:
        connection.close()


def redis_pid(client: redis.Redis) -> int:
    return int(client.info("server")["process_id"])


def floor_cpu_ms_per_mib(work: Path, mib: int = 64) -> dict[str, float]:
    """This process's CPU-ms per MiB to sha256 it, md5 it (minio's Content-MD5 on HTTPS;
    on plain HTTP it signs each part's sha256 instead), write it (256 KiB chunks, one fsync) and
    copy a file of it (shutil.copyfileobj, 1 MiB chunks, fsync): the per-MiB floor of a
    download into the directory store."""
    data = random.Random(1).randbytes(mib * MIB)
    chunks = [data[i:i + 256 * 1024] for i in range(0, len(data), 256 * 1024)]

    def cpu_ms(run: Any) -> float:
        started = time.process_time()
        run()
        return round((time.process_time() - started) * 1000 / mib, 2)

    def hash_with(name: str) -> Any:
        def run() -> None:
            hasher = hashlib.new(name)
            for chunk in chunks:
                hasher.update(chunk)
        return run

    source, target = work / "floor-source", work / "floor-target"

    def write_it() -> None:
        with source.open("wb") as out:
            for chunk in chunks:
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())

    def copy_it() -> None:
        with source.open("rb") as inp, target.open("wb") as out:
            shutil.copyfileobj(inp, out, MIB)
            out.flush()
            os.fsync(out.fileno())

    figures = {"sha256": cpu_ms(hash_with("sha256")), "md5": cpu_ms(hash_with("md5")),
               "write_fsync": cpu_ms(write_it),
               "copy_fsync": cpu_ms(copy_it)}
    source.unlink()
    target.unlink()
    return figures


# -- checking ----------------------------------------------------------------------------------

def check_records(records: Sequence[Mapping[str, Any]],
                  expected: Mapping[str, Asset]) -> dict[str, Any]:
    """One record per URL, each with the file's sha256, size and type, status 200."""
    per_url = Counter(r.get("url") for r in records)
    wrong = [r.get("url") for r in records
             if r.get("url") not in expected
             or (r.get("sha256"), r.get("size"), r.get("status"), r.get("content_type")) != (
                 expected[r["url"]].sha256, expected[r["url"]].size, 200,
                 expected[r["url"]].media_type)]
    return {"records": len(records), "urls_with_record": len(set(per_url) & set(expected)),
            "urls_missing": len(set(expected) - set(per_url)),
            "urls_with_several": sum(1 for c in per_url.values() if c > 1),
            "wrong_records": len(wrong), "wrong_example": wrong[:3],
            "stored_new": sum(1 for r in records if r.get("stored") == "new")}


def check_stored(store: Any, records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Every record's object read back from the store: its bytes hash to the record's sha256."""
    bad = []
    for record in records:
        try:
            body = store.read(record["key"])
        except KeyError:
            bad.append(record["url"])
            continue
        if hashlib.sha256(body).hexdigest() != record["sha256"]:
            bad.append(record["url"])
    return {"objects_checked": len(records), "objects_bad": len(bad), "bad_example": bad[:3]}


# -- the run -----------------------------------------------------------------------------------

@contextmanager
def asset_store(args: argparse.Namespace, work: Path) -> Iterator[tuple[dict[str, str],
                                                                         S3Server | None]]:
    """The workers' MEDIA_STORE environment, and moto's server with ``--store s3``."""
    if args.store == "file":
        yield {"MEDIA_STORE": str(work / "store")}, None
        return
    with S3Server() as s3:
        saved = {name: os.environ.get(name) for name in s3.env()}
        os.environ.update(s3.env())  # this process reads the store back (minio's chain)
        try:
            yield {**s3.env(), "MEDIA_STORE": f"s3://{BUCKET}"}, s3
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def publish(settings: Any, client: redis.Redis, site: NginxSite,
            assets: Sequence[Asset]) -> float:
    """Every asset as a media request, by kind; returns the seconds it took."""
    started = time.monotonic()
    with Producer(settings, client) as producer:
        for kind in sorted({a.kind for a in assets}):
            urls = [site.url(a.path) for a in assets if a.kind == kind]
            summary = producer.submit(urls, extra={"media": {"kind": kind, "page": PAGE}})
            if summary.new != len(urls):
                raise RuntimeError(f"producer: {summary} for {len(urls)} {kind} URLs")
    return time.monotonic() - started


def wait_records(client: redis.Redis, total: int, timeout_s: float) -> tuple[int, int]:
    """Poll until ``assets`` + ``failures`` hold ``total`` entries; (assets, failures)."""
    deadline = time.monotonic() + timeout_s
    while True:
        done, failed = client.xlen(ASSETS_STREAM), client.xlen("failures")
        if done + failed >= total or time.monotonic() > deadline:
            return done, failed
        time.sleep(0.02)


def start_workers(args: argparse.Namespace, env: Mapping[str, str],
                  work: Path) -> list[Watched]:
    py = str(REPO_ROOT / ".venv" / "bin" / "python")
    return [Watched.start([py, "worker.py", "--media", "--idle-exit", "600"],
                          name=f"media-{i}", env=dict(env, WORKER_ID=f"media-{i}"),
                          cwd=REPO_ROOT, log_path=work / f"worker-media-{i}.log")
            for i in range(args.workers)]


def wait_consuming(rabbitmq_url: str, workers: Sequence[Watched], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while min(consumers(rabbitmq_url, topology.MEDIA_QUEUES).values()) < len(workers):
        dead = [w.name for w in workers if w.proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            raise RuntimeError(f"download workers not consuming ({dead or 'timeout'}); "
                               "see their logs (--keep)")
        time.sleep(0.1)


def measure(args: argparse.Namespace, services: Any = None) -> dict[str, Any]:
    """The run; ``services``: RabbitMQ and Redis already running (a test's), else started."""
    with tempfile.TemporaryDirectory(prefix="media-cost-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        assets = write_docroot(work / "site", assets=args.assets, size_kb=args.size,
                               big=args.big, big_mb=args.big_mb)
        total_bytes = sum(a.size for a in assets)
        log(f"site: {len(assets)} files, {total_bytes / MIB:.0f} MiB")
        floor = floor_cpu_ms_per_mib(work)
        services = services or stack.enter_context(fleet_services())
        site = stack.enter_context(NginxSite(work / "site", server_extra=site_config()))
        store_env, s3 = stack.enter_context(asset_store(args, work))
        reset_state(services.rabbitmq_url, services.redis_url, all_databases=True)
        (work / "spool").mkdir()
        env = fleet_env(services, args.concurrency, LOG_LEVEL="WARNING",
                        MEDIA_SPOOL_DIR=str(work / "spool"), **store_env)
        settings = load_settings(env)
        expected = {site.url(a.path): a for a in assets}
        client = redis.Redis.from_url(services.redis_url)
        stack.callback(client.close)
        workers = start_workers(args, env, work)
        spies: list[tuple[subprocess.Popen[bytes], Path]] = []
        try:
            wait_consuming(services.rabbitmq_url, workers, 60)
            spies = start_profilers(args, workers, work)
            rpid = redis_pid(client)
            others = {"nginx": lambda: group_cpu_s(site.pid or 0),
                      "redis": lambda: proc_cpu_s(rpid) or 0.0}
            if s3 is not None:
                others["moto_s3"] = lambda: group_cpu_s(s3.pid or 0)
            cpu_before = {w.name: tree_cpu_s(w.pid) for w in workers}
            others_before = {k: f() for k, f in others.items()}
            started = time.monotonic()
            publish_s = publish(settings, client, site, assets)
            done, failed = wait_records(client, len(assets), args.timeout_s)
            span_s = time.monotonic() - started
            cpu_after = {w.name: tree_cpu_s(w.pid) for w in workers}
            others_after = {k: f() for k, f in others.items()}
        finally:
            for worker in workers:
                worker.terminate()
            exits = {w.name: w.wait(60) for w in workers}
            profile = stop_profilers(spies)
            if args.keep:
                kept = Path(tempfile.mkdtemp(prefix="media-cost-kept-"))
                for path in work.glob("*.log"):
                    shutil.copy(path, kept / path.name)
                log(f"logs kept in {kept}")
        records = [json.loads(f[b"json"]) for _id, f in client.xrange(ASSETS_STREAM)]
        failures = [json.loads(f[b"json"]) for _id, f in client.xrange("failures")]
        figures: dict[str, Any] = {
            "store": args.store, "assets": len(assets), "small": args.assets,
            "small_kib": args.size, "big": args.big, "big_mib": args.big_mb,
            "mib": round(total_bytes / MIB, 1), "workers": args.workers,
            "concurrency": args.concurrency, "publish_s": round(publish_s, 2),
            "span_s": round(span_s, 2), "records_seen": done, "failures": len(failures),
            "failure_example": [(f.get("url"), f.get("reason")) for f in failures[:3]],
            "assets_per_s": round(done / span_s, 1), "mib_per_s": round(
                sum(r.get("size", 0) for r in records) / MIB / span_s, 1),
            "floor_cpu_ms_per_mib": floor, "exits": exits,
            **check_records(records, expected),
            **check_stored(open_store(settings), records),
            "per_worker": per_worker(workers, records, cpu_before, cpu_after, span_s),
            "others_cpu_s": {k: round(others_after[k] - others_before[k], 2) for k in others},
        }
        if profile is not None:
            figures["profile"] = profile
        return figures


def per_worker(workers: Sequence[Watched], records: Sequence[Mapping[str, Any]],
               before: Mapping[str, float], after: Mapping[str, float],
               span_s: float) -> dict[str, Any]:
    """Each worker's assets, bytes, CPU over the window and peak RSS."""
    out = {}
    for worker in workers:
        mine = [r for r in records if r.get("worker") == worker.name]
        mib = sum(r.get("size", 0) for r in mine) / MIB
        cpu_s = after[worker.name] - before[worker.name]
        out[worker.name] = {
            "assets": len(mine), "mib": round(mib, 1),
            "assets_per_s": round(len(mine) / span_s, 1), "mib_per_s": round(mib / span_s, 1),
            "cpu_s": round(cpu_s, 2), "cores": round(cpu_s / span_s, 2),
            "cpu_ms_per_mib": round(cpu_s * 1000 / mib, 2) if mib else None,
            "cpu_ms_per_asset": round(cpu_s * 1000 / len(mine), 2) if mine else None,
            "cpu_s_with_start": round(worker.cpu_s or 0.0, 2),
            "peak_rss_mb": round((worker.maxrss_kb or 0) / 1024)}
    return out


def start_profilers(args: argparse.Namespace, workers: Sequence[Watched],
                    work: Path) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """With --profile: py-spy (every thread that is not idle: hashlib and the socket and file
    calls release the GIL) on each worker until it exits."""
    if not args.profile:
        return []
    spy = find_py_spy(Path(args.bench_python))
    if spy is None:
        log("--profile: py-spy not found (bench/.venv has it after bench/run.sh); not profiling")
        return []
    spies = []
    for worker in workers:
        out = work / f"{worker.name}.folded"
        spies.append((subprocess.Popen(
            [spy, "record", "--pid", str(worker.pid), "--rate", "200", "--format", "raw",
             "--output", str(out)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL), out))
    return spies


def stop_profilers(spies: Sequence[tuple[subprocess.Popen[bytes], Path]]) -> dict[str, Any] | None:
    if not spies:
        return None
    for proc, _out in spies:
        try:
            proc.wait(timeout=30)  # py-spy stops when its target exits
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return summarise_profile([out for _proc, out in spies], top=12)


def summary(figures: Mapping[str, Any]) -> list[str]:
    f = figures
    lines = [
        f"media_cost --store {f['store']}: {f['assets']} assets ({f['small']} x {f['small_kib']} "
        f"KiB + {f['big']} x {f['big_mib']} MiB = {f['mib']} MiB) in {f['span_s']} s = "
        f"{f['assets_per_s']} assets/s, {f['mib_per_s']} MiB/s; {f['workers']} worker(s) x "
        f"{f['concurrency']}",
        f"  records {f['records']} ({f['urls_missing']} missing, {f['urls_with_several']} "
        f"several, {f['wrong_records']} wrong), failures {f['failures']}, objects read back "
        f"{f['objects_checked']} ({f['objects_bad']} bad)",
        "  | worker | assets | MiB | assets/s | MiB/s | CPU s | cores | CPU ms/MiB | "
        "CPU ms/asset | peak RSS MB |",
        "  |---|---|---|---|---|---|---|---|---|---|"]
    for name, w in f["per_worker"].items():
        lines.append(
            f"  | {name} | {w['assets']} | {w['mib']} | {w['assets_per_s']} | {w['mib_per_s']} "
            f"| {w['cpu_s']} | {w['cores']} | {w['cpu_ms_per_mib']} | {w['cpu_ms_per_asset']} "
            f"| {w['peak_rss_mb']} |")
    others = ", ".join(f"{k} {v} s" for k, v in f["others_cpu_s"].items())
    floor = ", ".join(f"{k} {v}" for k, v in f["floor_cpu_ms_per_mib"].items())
    lines += [f"  other processes' CPU over the window: {others}",
              f"  floor, CPU ms per MiB in this process: {floor}"]
    if "profile" in f and f["profile"].get("samples"):
        lines.append("  profile (self %): " + ", ".join(
            f"{name} {share}" for name, share in f["profile"]["self"][:8]))
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assets", type=int, default=400, help="small files")
    parser.add_argument("--size", type=int, default=256, help="KiB of a small file")
    parser.add_argument("--big", type=int, default=4, help="big files")
    parser.add_argument("--big-mb", type=int, default=16, help="MiB of a big file")
    parser.add_argument("--workers", type=int, default=1, help="download worker processes")
    parser.add_argument("--concurrency", type=int, default=8, help="WORKER_CONCURRENCY")
    parser.add_argument("--store", choices=("file", "s3"), default="file")
    parser.add_argument("--timeout-s", type=float, default=240.0)
    parser.add_argument("--profile", action="store_true", help="py-spy on each worker")
    parser.add_argument("--bench-python", default=str(REPO_ROOT / "bench" / ".venv" / "bin"
                                                      / "python"))
    parser.add_argument("--keep", action="store_true", help="keep the workers' logs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    figures = measure(args)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    print("\n".join(summary(figures)))
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
