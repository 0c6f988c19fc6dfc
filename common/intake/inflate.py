"""Safe decompression: a body in bounded steps, gunzipped when gzip, refused past a size cap.

Gzip is told by content (magic bytes ``1f 8b``), never by name. Nothing is inflated in one
go: zlib gets at most _INFLATE_IN_BYTES of input and may give at most _INFLATE_OUT_BYTES of
output a step, and the caller's byte cap is checked after each step, so a gzip bomb is
refused after at most the cap's worth of streaming work and is never held in memory. Members
in a row are legal gzip (RFC 1952) and inflate as one stream; a flood of tiny members is
refused at ``max_members``. Pure: bytes in, bytes out.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

GZIP_MAGIC = b"\x1f\x8b"
MAX_GZIP_MEMBERS = 10_000  # members in a row are legal; millions of tiny ones are an attack
STEP_BYTES = 1024 * 1024  # uncompressed bytes handed out per step (to a parser)
_INFLATE_IN_BYTES = 64 * 1024  # compressed bytes handed to zlib per step
_INFLATE_OUT_BYTES = 1024 * 1024  # most bytes one zlib step may produce
_GZIP_WBITS = 31  # zlib: gzip header and trailer, 32 KiB window


class InflateError(ValueError):
    """The gzip data was refused: not valid gzip, truncated, or too many members."""


class InflateTooLarge(InflateError):
    """The gzip data inflates to more than the caller's cap."""


def is_gzip(data: bytes) -> bool:
    """Told by content, never by name: gzip data starts with the magic bytes ``1f 8b``."""
    return data[:2] == GZIP_MAGIC


def decoded_chunks(body: bytes, max_bytes: int) -> Iterator[bytes]:
    """``body`` in steps of at most STEP_BYTES: gunzipped when it starts with the gzip magic.

    Raises:
        InflateTooLarge: more than ``max_bytes``, as given or once inflated.
        InflateError: gzip that is not valid, ends early or has too many members.
    """
    if is_gzip(body):
        yield from gunzip(body, max_bytes)
        return
    if len(body) > max_bytes:
        raise InflateTooLarge(f"more than {max_bytes} bytes")
    for start in range(0, len(body), STEP_BYTES):
        yield body[start:start + STEP_BYTES]


def gunzip(data: bytes, max_bytes: int,
           max_members: int = MAX_GZIP_MEMBERS) -> Iterator[bytes]:
    """Inflate gzip ``data`` (members in a row allowed) in bounded steps.

    Yields the inflated bytes a step at a time (at most _INFLATE_OUT_BYTES each).
    Trailing zero padding after the last member (some tools write it) is ignored.

    Raises:
        InflateTooLarge: more than ``max_bytes`` would come out (raised once they do).
        InflateError: not valid gzip, ends early, more than ``max_members`` members.
    """
    total = 0
    members = 1
    pos = 0
    pending = b""
    inflater = zlib.decompressobj(wbits=_GZIP_WBITS)
    while True:
        if not pending and pos < len(data):
            pending = data[pos:pos + _INFLATE_IN_BYTES]
            pos += len(pending)
        try:
            out = inflater.decompress(pending, _INFLATE_OUT_BYTES)
        except zlib.error as exc:
            raise InflateError(f"not valid gzip data: {exc}") from None
        pending = inflater.unconsumed_tail
        if out:
            total += len(out)
            if total > max_bytes:
                raise InflateTooLarge(f"inflates to more than {max_bytes} bytes")
            yield out
        if inflater.eof:
            pending = inflater.unused_data
            if not pending.strip(b"\0") and not data[pos:].strip(b"\0"):
                return  # done; trailing zero padding (some tools write it) is fine
            members += 1
            if members > max_members:
                raise InflateError(f"more than {max_members} gzip members; refused")
            inflater = zlib.decompressobj(wbits=_GZIP_WBITS)
        elif not out and not pending and pos >= len(data):
            raise InflateError("gzip data ends early (truncated file)")
