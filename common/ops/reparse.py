"""Re-parse archived pages: results again from WARC files with the current rules, no fetching.

    python reparse.py archive/                          # every *.warc.gz and *.warc in it
    python reparse.py a.warc.gz b.warc.gz -o out.jsonl  # to a file instead of stdout
    python reparse.py archive/ --rules @new-rules.yml   # other rules than EXTRACT_RULES

For every ``response`` record that ends a fetch (a redirect hop, a 301/302/303/307/308 with a
Location, is followed to the record it led to, and the result is given the URL first
requested, as the worker's is), the response is read back the way the fetcher read it: the
head with the header callback's own parser, the body de-chunked (warcio) and decoded from its
Content-Encoding by the fetcher's own decoder (common/web/curl.py), cut at MAX_BODY_BYTES,
not read when ALLOWED_CONTENT_TYPES does not want it. Then the worker's one page reader
(:class:`~common.work.page_record.PageReader`: parse, EXTRACT_RULES, EXTRACTOR) makes the
record and MAX_RECORD_BYTES bounds it, as in the worker. With the settings the crawl ran
with, ``data`` and ``data_errors`` come out byte for byte as the worker stored them.

Output: one JSON line per page (the result store's encoding), the result record without the
fields of one fetch run (fetched_at, worker, queue, depth, attempts, cached, elapsed_ms), with
``archive`` ({"file", "offset", "length"} of the response record). Exits 0, 1 when some
record could not be read (logged), 2 on bad arguments or rules.
"""

from __future__ import annotations

import argparse
import io
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urljoin

from warcio.archiveiterator import ArchiveIterator
from warcio.bufferedreaders import ChunkedDataReader
from warcio.exceptions import ArchiveLoadFailed

from common.core import values
from common.core.config import Settings
from common.ops import cli
from common.store.results import encode
from common.web.curl import first_header, header_dict, parse_head
from common.web.decoding import decode_body
from common.web.fetch import Fetcher, FetchResult
from common.work.archive_files import OPEN_SUFFIX
from common.work.page_record import PageReader
from common.work.record import bound

logger = logging.getLogger(__name__)

_REDIRECTS = frozenset({301, 302, 303, 307, 308})
#: Fields of one fetch run, not of the page: left out of the output.
RUN_FIELDS = ("fetched_at", "worker", "queue", "depth", "attempts", "cached", "elapsed_ms")


class Reparser:
    """Reads response records back into result records (one per page)."""

    def __init__(self, settings: Settings) -> None:
        # Crawl mode's link plan and enqueueing are not part of a result: off.
        self.settings = settings.with_overrides(crawl_enabled=False)
        self.pages = PageReader(self.settings)  # ConfigError for bad rules or EXTRACTOR
        self.fetcher = Fetcher(self.settings)  # its content-type rule only; never fetches
        self.max_block = settings.max_header_bytes + 2 * settings.max_body_bytes + (1 << 20)
        self.failed = 0

    def records(self, path: Path) -> Iterator[dict[str, Any]]:
        """The result records of the pages archived in ``path``."""
        name = path.name.removesuffix(".open") if path.name.endswith(OPEN_SUFFIX) else path.name
        first: str | None = None  # the URL that started the redirect chain in progress
        expected: str | None = None  # where its last hop pointed
        hops = 0
        with open(path, "rb") as stream:
            archive = ArchiveIterator(stream, no_record_parse=True)
            try:
                for record in archive:
                    if record.rec_type != "response" or not (record.content_type or "") \
                            .startswith("application/http"):
                        continue
                    block = record.raw_stream.read(self.max_block)
                    archive.read_to_end(record)
                    ref = {"file": name, "offset": archive.get_record_offset(),
                           "length": archive.get_record_length()}
                    target = record.rec_headers.get_header("WARC-Target-URI") or ""
                    status, lines, rest = parse_head(block)
                    location = first_header(lines, b"location:")
                    chained = expected == target
                    if status in _REDIRECTS and location is not None:
                        first, hops = (first, hops + 1) if chained else (target, 1)
                        expected = urljoin(target, location).split("#", 1)[0]
                        continue
                    url, redirects = (first or target, hops) if chained else (target, 0)
                    first, expected, hops = None, None, 0
                    cut = record.rec_headers.get_header("WARC-Truncated")
                    try:
                        yield self.page(url, target, status, lines, rest, cut, ref, redirects)
                    except ValueError as exc:
                        self.failed += 1
                        logger.warning("%s offset %d (%s): cannot read the body: %s", name,
                                       ref["offset"], target, exc)
            except (ArchiveLoadFailed, EOFError, OSError) as exc:
                self.failed += 1
                logger.warning("%s: reading stopped: %s", name, exc)

    def page(self, url: str, target: str, status: int, lines: list[bytes], rest: bytes,
             cut: str | None, ref: dict[str, Any], redirects: int) -> dict[str, Any]:
        """One response as the worker would have recorded it.

        Raises:
            ValueError: the body does not decode (an encoding the fetcher refuses).
        """
        content_type = first_header(lines, b"content-type:")
        skipped = not self.fetcher.wanted(content_type)
        body, over = b"", False
        if not skipped:
            encoding = (first_header(lines, b"transfer-encoding:") or "").lower()
            raw = _dechunk(rest) if "chunked" in encoding else rest
            body, over = decode_body(raw, first_header(lines, b"content-encoding:"),
                                     self.settings.max_body_bytes)
        response = FetchResult(url, target, status, content_type, body, 0.0,
                               truncated=over or cut == "length", headers=header_dict(lines),
                               redirects=redirects,
                               skipped="content_type" if skipped else None, archive=ref)
        read = self.pages.read(url, response, queue=None, depth=0, attempts=0, cached=False)
        record = bound(read.record, self.settings.max_record_bytes)
        return {key: value for key, value in record.items() if key not in RUN_FIELDS}


def _dechunk(data: bytes) -> bytes:
    """A chunked body's content (warcio's reader; not chunked after all: as it is)."""
    reader = ChunkedDataReader(io.BytesIO(data))
    return b"".join(iter(lambda: reader.read(1 << 16), b""))


def warc_paths(inputs: list[str]) -> list[Path]:
    """The files named, and the closed WARC files of each directory named, in name order.

    Raises:
        ValueError: a name that does not exist.
    """
    paths: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            paths += sorted(p for p in path.iterdir()
                            if p.is_file() and p.name.endswith((".warc.gz", ".warc")))
        elif path.is_file():
            paths.append(path)
        else:
            raise ValueError(f"no such file or directory: {item}")
    return paths


def reparse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("inputs", nargs="+", metavar="WARC_OR_DIR",
                        help="WARC files, or directories of them (ARCHIVE_DIR)")
    parser.add_argument("-o", "--output", metavar="OUT.jsonl", help="write here, not stdout")
    parser.add_argument("--rules", type=cli.argument(values.rules_ref), metavar="@FILE",
                        help="extraction rules instead of EXTRACT_RULES (@FILE or inline JSON)")
    return parser.parse_args(argv)


def reparse_main(settings: Settings, argv: list[str] | None = None,
                 prog: str | None = None) -> int:
    """``reparse.py``."""
    args = reparse_args(argv, prog)
    if args.rules is not None:
        settings = settings.with_overrides(extract_rules=args.rules)
    try:
        paths = warc_paths(args.inputs)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    reparser = Reparser(settings)
    if args.output in (None, "-"):
        return _run(reparser, paths, sys.stdout.buffer)
    try:
        out = open(args.output, "wb")  # noqa: SIM115
    except OSError as exc:
        print(f"error: cannot open --output {args.output}: {exc}", file=sys.stderr)
        return cli.EXIT_CONFIG
    with out:
        return _run(reparser, paths, out)


def _run(reparser: Reparser, paths: list[Path], out: IO[bytes]) -> int:
    pages = 0
    for path in paths:
        for record in reparser.records(path):
            out.write(encode(record) + b"\n")
            pages += 1
    out.flush()
    logger.info("re-parsed %d pages from %d WARC files (%d records unreadable)", pages,
                len(paths), reparser.failed)
    return cli.EXIT_PARTIAL if reparser.failed else cli.EXIT_OK
