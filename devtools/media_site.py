"""A product catalogue with images, PDFs and large files, served by Debian's nginx on loopback
(devtools/nginx_site.py), for the media stage's tests and bench.

    with MediaSite(tmp_path) as site:
        site.pages()                  # the product pages' URLs
        site.assets()                 # {asset url: (sha256, size, media type)} they reference
        site.url("/big/huge.mp4")     # 2 GiB, sparse: no disk used

The docroot (``tmp_path/media-site``):

* ``/catalogue/index.html`` links every ``/catalogue/p{i}.html``; each product page has 1-3
  ``<img class="product" src=...>`` (real PNGs of different sizes, some JPEG-ish files) and one
  ``<a class="manual" href=...pdf>``. ``/images/shared.png`` is on products 0 and 1 (one URL,
  two pages); ``/images/p2-0.png`` and ``/images/copy/p3.png`` are the same bytes under two URLs
  (product 2 and 3): stored once by hash.
* ``/big/large.bin`` (``large_bytes``, 64 MiB by default, deterministic bytes),
  ``/big/medium.bin`` (8 MiB) and ``/big/huge.mp4`` (2 GiB made with ``os.truncate``: a sparse
  file of zeros, nothing written).
* ``/slow/<file>``: ``/big/``'s files at ``slow_rate`` per connection (nginx ``limit_rate``),
  for a transfer to be broken off midway (:meth:`MediaSite.kill_worker`).
* ``/stream/<file>``: ``/big/``'s files with no Content-Length (nginx's SSI filter drops it and
  sends the body chunked), for caps that must hold while a body grows.
* ``/redirect/blocked.png``: a 302 to ``http://10.0.0.1/x.png`` (a private address: the address
  guard refuses it before connecting); ``/redirect/p0.png``: a 301 to ``/images/p0-0.png``.

nginx serves byte ranges (``Accept-Ranges: bytes``, ETag, Last-Modified) itself. Its access log
is the ``timed`` format (devtools/nginx_site.py), read by :meth:`MediaSite.requests` as (path,
status, body bytes sent) and by :meth:`MediaSite.timed_requests` with when each was logged.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import signal
import struct
import time
import zlib
from pathlib import Path
from types import TracebackType

from devtools.nginx_site import NginxSite

MIB = 1024 * 1024
HUGE_BYTES = 2 * 1024 * MIB
MEDIUM_BYTES = 8 * MIB
TYPES = {"png": "image/png", "jpg": "image/jpeg", "pdf": "application/pdf",
         "mp4": "video/mp4", "bin": "application/octet-stream", "html": "text/html"}
#: A line of the ``timed`` log format (devtools/nginx_site.py): when, status, bytes, request.
_TIMED = re.compile(r'^(\d+\.\d+) (\d{3}) (\d+) "(?:\S+) (\S+)(?: [^"]*)?"')


def png(width: int, height: int, seed: int) -> bytes:
    """A real RGB PNG of ``width`` x ``height``, pixels from ``seed`` (noisy: little to compress)."""
    rng = random.Random(seed)
    rows = b"".join(b"\0" + rng.randbytes(width * 3) for _ in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(rows, 6)) + chunk(b"IEND", b""))


def jpeg_ish(size: int, seed: int) -> bytes:
    """JPEG's start and end markers around deterministic bytes (not decodable: never decoded)."""
    return b"\xff\xd8\xff\xe0" + random.Random(seed).randbytes(size) + b"\xff\xd9"


def pdf(title: str) -> bytes:
    """A one-page PDF whose page says ``title``."""
    text = f"BT /F1 18 Tf 72 720 Td ({title}) Tj ET".encode()
    objects = [b"<< /Type /Catalog /Pages 2 0 R >>",
               b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
               b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
               b"/Contents 4 0 R /Resources << /Font << /F1 5 0 R >> >> >>",
               b"<< /Length %d >>\nstream\n%s\nendstream" % (len(text), text),
               b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % offset for offset in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1, xref)
    return bytes(out)


def _write_pattern(path: Path, size: int, seed: int) -> None:
    """``size`` deterministic bytes: a 1 MiB random block repeated (fast to write)."""
    block = random.Random(seed).randbytes(MIB)
    with path.open("wb") as out:
        left = size
        while left > 0:
            out.write(block[:min(left, MIB)])
            left -= MIB


def build_catalogue(root: Path, products: int = 6) -> dict[str, tuple[bytes, str]]:
    """Write the catalogue under ``root``; returns {path: (bytes, media type)} of every asset
    a product page references."""
    assets: dict[str, tuple[bytes, str]] = {}
    pages: list[str] = []
    for i in range(products):
        refs: list[str] = []
        for k in range(1 + i % 3):
            if k == 1 and i % 2:
                path, body = f"/images/p{i}-{k}.jpg", jpeg_ish(2000 + 500 * i, 1000 + i)
            else:
                path, body = f"/images/p{i}-{k}.png", png(8 + 4 * i + k, 6 + 2 * k, 10 * i + k)
            assets[path] = (body, TYPES[path.rsplit(".", 1)[1]])
            refs.append(path)
        if i in (0, 1):
            assets["/images/shared.png"] = (png(20, 20, 4242), "image/png")
            refs.append("/images/shared.png")
        if i == 3:
            assets["/images/copy/p3.png"] = assets["/images/p2-0.png"]
            refs.append("/images/copy/p3.png")
        manual = f"/manuals/p{i}.pdf"
        assets[manual] = (pdf(f"Manual of product {i}"), "application/pdf")
        imgs = "".join(f'<img class="product" src="{ref}" alt="">\n' for ref in refs)
        page = (f"<html><head><title>Product {i}</title></head><body>\n<h1>Product {i}</h1>\n"
                f'{imgs}<a class="manual" href="{manual}">Manual</a>\n</body></html>\n')
        pages.append(f"/catalogue/p{i}.html")
        (root / "catalogue").mkdir(parents=True, exist_ok=True)
        (root / pages[-1].lstrip("/")).write_text(page)
    links = "".join(f'<a href="{p.rsplit("/", 1)[1]}">{p}</a>\n' for p in pages)
    (root / "catalogue" / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    for path, (body, _type) in assets.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
    return assets


class MediaSite:
    """nginx serving the catalogue and the big files from ``directory`` on 127.0.0.1.

    Args:
        directory: where the docroot and the access log go (a test's ``tmp_path``).
        products: product pages in the catalogue.
        large_bytes: the size of ``/big/large.bin``.
        slow_rate: nginx ``limit_rate`` of ``/slow/`` (``"2m"``: 2 MB/s).
    """

    def __init__(self, directory: Path, *, products: int = 6, large_bytes: int = 64 * MIB,
                 slow_rate: str = "4m") -> None:
        self.root = Path(directory) / "media-site"
        self.log = Path(directory) / "media-site-access.log"
        self.products = products
        self.large_bytes = large_bytes
        self.slow_rate = slow_rate
        self._assets: dict[str, tuple[bytes, str]] = {}
        self.nginx: NginxSite | None = None

    def _server_extra(self) -> str:
        types = " ".join(f"{mime} {ext};" for ext, mime in TYPES.items())
        big = self.root / "big"
        return (f"        types {{ {types} }}\n"
                f"        access_log {self.log} timed;\n"
                f"        location /slow/ {{ alias {big}/; limit_rate {self.slow_rate}; }}\n"
                f"        location /stream/ {{ alias {big}/; ssi on; ssi_types *; }}\n"
                "        location = /redirect/blocked.png { return 302 http://10.0.0.1/x.png; }\n"
                "        location = /redirect/p0.png { return 301 /images/p0-0.png; }\n")

    def start(self) -> MediaSite:
        self.root.mkdir(parents=True, exist_ok=True)
        self._assets = build_catalogue(self.root, self.products)
        big = self.root / "big"
        big.mkdir(exist_ok=True)
        large = big / "large.bin"
        if not large.exists() or large.stat().st_size != self.large_bytes:
            _write_pattern(large, self.large_bytes, 7)
        _write_pattern(big / "medium.bin", MEDIUM_BYTES, 8)
        huge = big / "huge.mp4"
        huge.touch()
        os.truncate(huge, HUGE_BYTES)  # sparse: no block written
        self.nginx = NginxSite(self.root, server_extra=self._server_extra()).start()
        return self

    def stop(self) -> None:
        nginx, self.nginx = self.nginx, None
        if nginx is not None:
            nginx.stop()

    def __enter__(self) -> MediaSite:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # -- what a test asks -------------------------------------------------------------------------
    def url(self, path: str, host: str = "localhost") -> str:
        if self.nginx is None:
            raise RuntimeError("media site not started")
        return self.nginx.url(path, host)

    def pages(self) -> list[str]:
        """The product pages' URLs."""
        return [self.url(f"/catalogue/p{i}.html") for i in range(self.products)]

    def assets(self) -> dict[str, tuple[str, int, str]]:
        """{url: (sha256, size, media type)} of every asset the product pages reference."""
        return {self.url(path): (hashlib.sha256(body).hexdigest(), len(body), mime)
                for path, (body, mime) in self._assets.items()}

    def expected_assets(self) -> dict[str, str]:
        """{url: sha256} of every asset the product pages reference."""
        return {url: sha for url, (sha, _size, _type) in self.assets().items()}

    def file(self, path: str) -> Path:
        """The file served at ``path`` (``/big/large.bin``)."""
        return self.root / path.lstrip("/")

    def log_offset(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def requests(self, since: int = 0) -> list[tuple[str, int, int]]:
        """(path, status, body bytes sent) of each request logged after byte ``since``
        (nginx logs a request once its response ended, or the client went away)."""
        return [(path, status, sent) for _at, path, status, sent in self.timed_requests(since)]

    def timed_requests(self, since: int = 0) -> list[tuple[float, str, int, int]]:
        """(when it was logged, epoch seconds to the ms; path, status, body bytes sent) of
        each request logged after byte ``since``."""
        if not self.log.exists():
            return []
        with self.log.open("r", encoding="utf-8", errors="replace") as handle:
            handle.seek(since)
            lines = handle.readlines()
        return [(float(m.group(1)), m.group(4), int(m.group(2)), int(m.group(3)))
                for m in map(_TIMED.match, lines) if m is not None]

    def await_requests(self, at_least: int = 1, since: int = 0,
                       timeout_s: float = 10.0) -> list[tuple[str, int, int]]:
        deadline = time.monotonic() + timeout_s
        while len(found := self.requests(since)) < at_least and time.monotonic() < deadline:
            time.sleep(0.02)
        return found

    def kill_worker(self) -> list[int]:
        """SIGKILL nginx's worker processes (its master starts new ones): every connection
        they held is cut midway. Returns the pids killed."""
        master = self.nginx.pid if self.nginx is not None else None
        if master is None:
            raise RuntimeError("media site not started")
        killed = []
        for pid in _children(master):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        return killed


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            found.append(int(entry.name))
    return found
