"""`proxy.max_body` (request/bodylimit.py): the buffer that keeps a journaled body up to the limit and nothing of
one byte more, the request hook's verdict from it, the declared length, and decoding for identity bounded by the
limit. Refusals through the Admission addon: test_admission.py."""

import gzip
import zlib

import pytest
from mitmproxy.test import taddons, tflow, tutils

from proxy_addon.request import bodylimit

LIMIT = 100


def test_the_bounded_buffer_keeps_nothing_past_its_limit():
    state: dict = {}
    buffer = bodylimit.BoundedBody(10, state)
    buffer += b"12345"
    buffer += b"678"
    assert len(buffer) == 8 and bool(buffer) and not state.get("over")
    buffer += b"9abc"
    assert len(buffer) == 0 and state["over"] and state["seen"] == 12
    buffer += b"more"
    assert bytes(buffer) == b"" and state["seen"] == 16
    kept = bodylimit.BoundedBody(100, {})
    kept += b"one"
    assert bytes(kept) == b"one" and len(kept) == 0


def test_decoding_is_bounded():
    plain = b'{"a": 1}'
    for encoded, encoding in ((gzip.compress(plain), "gzip"), (zlib.compress(plain), "deflate")):
        request = tutils.treq(content=encoded, headers=((b"content-encoding", encoding.encode()),))
        assert bodylimit.decoded_body(request, 1000) == (plain, True)
    bomb = gzip.compress(b"x" * 10_000_000)
    request = tutils.treq(content=bomb, headers=((b"content-encoding", b"gzip"),))
    assert bodylimit.decoded_body(request, 1000) == (bomb, False)  # never inflated past the limit
    broken = tutils.treq(content=b"not gzip", headers=((b"content-encoding", b"gzip"),))
    assert bodylimit.decoded_body(broken, 1000) == (b"not gzip", False)
    assert bodylimit.decoded_body(tutils.treq(content=plain), 1000) == (plain, True)


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
@pytest.mark.parametrize("chunk", [1, 7, LIMIT + 1])
def test_the_bounded_buffer_keeps_a_body_of_the_limit_and_nothing_of_one_byte_more(size, chunk):
    body = bytes(range(size))
    state: dict = {}
    buffer = bodylimit.BoundedBody(LIMIT, state)
    for i in range(0, size, chunk):
        buffer += body[i:i + chunk]
    assert bool(state.get("over")) is (size > LIMIT) and state["seen"] == size
    assert bytes(buffer) == (body if size <= LIMIT else b"")


@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
def test_a_body_is_over_max_body_from_one_byte_past_it(size):
    """What the request hook checks: the body as read (the buffer's own verdict, when it was bounded)."""
    read = tflow.tflow()
    read.request.content = b"x" * size
    assert bodylimit.over_limit(read, LIMIT) == (size if size > LIMIT else None)
    bounded = tflow.tflow()
    buffer = bodylimit.BoundedBody(LIMIT, bounded.metadata.setdefault(bodylimit.METADATA_KEY, {}))
    buffer += b"x" * size
    bounded.request.content = bytes(buffer)
    assert bodylimit.over_limit(bounded, LIMIT) == (size if size > LIMIT else None)


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
@pytest.mark.parametrize("size", [LIMIT - 1, LIMIT, LIMIT + 1])
def test_a_body_is_inflated_up_to_the_limit_and_no_further(encoding, size):
    plain = bytes(i % 7 for i in range(size))
    encoded = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    request = tutils.treq(content=encoded, headers=((b"content-encoding", encoding.encode()),))
    assert bodylimit.decoded_body(request, LIMIT) == ((plain, True) if size <= LIMIT else (encoded, False))


def encoded_request(content: bytes, encoding: str):
    return tutils.treq(content=content, headers=((b"content-encoding", encoding.encode()),))


def test_raw_deflate_as_some_clients_send_it_is_inflated_too():
    plain = b'{"raw": "deflate"}'
    squeezer = zlib.compressobj(wbits=-15)
    raw = squeezer.compress(plain) + squeezer.flush()
    assert bodylimit.decoded_body(encoded_request(raw, "deflate"), LIMIT) == (plain, True)
    assert bodylimit.decoded_body(encoded_request(raw, "gzip"), LIMIT) == (raw, False)  # gzip has no raw form


@pytest.mark.parametrize("encoding", ["x-gzip", "GZIP", " gzip "])
def test_the_gzip_encodings_names(encoding):
    assert bodylimit.decoded_body(encoded_request(gzip.compress(b"abc"), encoding), LIMIT) == (b"abc", True)


def test_identity_and_an_empty_body_are_as_they_came():
    assert bodylimit.decoded_body(encoded_request(b"as is", "identity"), LIMIT) == (b"as is", True)
    assert bodylimit.decoded_body(encoded_request(b"", "gzip"), LIMIT) == (b"", True)


def test_another_encoding_is_decoded_only_when_small_enough_that_its_worst_case_is_bounded():
    """brotli and zstd may inflate past 1000x: decoded whole only when even that stays under the limit."""
    brotli = pytest.importorskip("brotli")
    plain = b"abc" * 3
    small = brotli.compress(plain)
    assert bodylimit.decoded_body(encoded_request(small, "br"), len(small) * 1032) == (plain, True)
    assert bodylimit.decoded_body(encoded_request(small, "br"), len(small) * 1032 - 1) == (small, False)
    assert bodylimit.decoded_body(encoded_request(b"\x00not brotli", "br"), 10**9) == (b"\x00not brotli", False)
    assert bodylimit.decoded_body(encoded_request(b"what", "unknown-coding"), 10**9) == (b"what", False)


@pytest.mark.parametrize(
    ("headers", "length"),
    [(((b"content-length", b"42"),), 42), (((b"content-length", b"0"),), 0),
     (((b"transfer-encoding", b"chunked"),), None), (((b"content-length", b"x"),), None),
     (((b"content-length", b"1"), (b"content-length", b"2")), None)],
)
def test_the_declared_length(headers, length):
    assert bodylimit.declared_length(tutils.treq(content=b"", headers=headers)) == length


def test_without_mitmproxys_stream_nothing_is_swapped_and_the_hook_still_checks():
    """A flow whose HTTP stream cannot be found (no proxy server here): the body is read whole, over_limit after."""
    f = tflow.tflow()
    with taddons.context():
        assert bodylimit.bound(f, LIMIT) is False
    assert bodylimit.METADATA_KEY not in f.metadata
    f.request.content = b"x" * (LIMIT + 1)
    assert bodylimit.over_limit(f, LIMIT) == LIMIT + 1
