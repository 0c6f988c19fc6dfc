"""Safe decompression alone: gzip by magic, bounded steps, the size cap, members in a row."""

from __future__ import annotations

import gzip

import pytest

from common.intake.inflate import (
    STEP_BYTES,
    InflateError,
    InflateTooLarge,
    decoded_chunks,
    gunzip,
    is_gzip,
)


def test_plain_bytes_come_back_in_steps_and_gzip_is_told_by_its_magic():
    body = b"x" * (2 * STEP_BYTES + 1)

    assert [len(c) for c in decoded_chunks(body, 10 * STEP_BYTES)] == [STEP_BYTES, STEP_BYTES, 1]
    assert b"".join(decoded_chunks(gzip.compress(body), 10 * STEP_BYTES)) == body
    assert is_gzip(gzip.compress(b"")) and not is_gzip(b"<urlset/>")


def test_no_step_is_bigger_than_a_megabyte_however_well_the_data_compresses():
    chunks = list(gunzip(gzip.compress(b"\0" * (8 * STEP_BYTES)), 8 * STEP_BYTES))

    assert sum(map(len, chunks)) == 8 * STEP_BYTES
    assert max(map(len, chunks)) <= 1024 * 1024


@pytest.mark.parametrize("gzipped", [True, False])
def test_more_than_the_cap_is_refused(gzipped):
    body = b"a" * 5000
    with pytest.raises(InflateTooLarge, match="more than 4096 bytes"):
        list(decoded_chunks(gzip.compress(body) if gzipped else body, 4096))


def test_members_in_a_row_are_one_stream_up_to_the_member_cap():
    two = gzip.compress(b"a") + gzip.compress(b"b") + b"\0" * 16

    assert b"".join(gunzip(two, 100, max_members=2)) == b"ab"
    with pytest.raises(InflateError, match="more than 1 gzip members"):
        list(gunzip(two, 100, max_members=1))


@pytest.mark.parametrize(("data", "message"), [
    (gzip.compress(b"hello world" * 100)[:-12], "ends early"),
    (b"\x1f\x8b\x08\x00garbage-garbage-garbage", "not valid gzip data"),
])
def test_broken_gzip_is_an_error(data, message):
    with pytest.raises(InflateError, match=message):
        list(gunzip(data, 1 << 20))
