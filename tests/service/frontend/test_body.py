"""The one body parser (`service.frontend.body`): whatever the bytes and the Content-Encoding, a JSON value or
a ServiceError of a client kind, never anything else."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.errors import ServiceError
from service.frontend.body import MAX_DEPTH, parse_body
from service.frontend.http_errors import STATUS

LIMIT = 64 * 1024


def refusal(raw: bytes, encoding: str | None = None, limit: int = LIMIT) -> ServiceError:
    with pytest.raises(ServiceError) as raised:
        parse_body(raw, encoding, limit)
    return raised.value


def test_nesting_is_read_up_to_the_bound_and_refused_past_it():
    assert parse_body(b"[" * (MAX_DEPTH - 1) + b"]" * (MAX_DEPTH - 1), None, LIMIT) is not None
    error = refusal(b"[" * 2000 + b"]" * 2000)  # json.loads raised RecursionError here: a 500
    assert error.kind == "validation" and f"more than {MAX_DEPTH} levels" in error.message
    assert refusal(b'{"a":' * 2000 + b"1" + b"}" * 2000).kind == "validation"


def test_huge_numbers_are_refused_or_read_as_floats_that_no_integer_field_takes():
    error = refusal(b'{"top_k": ' + b"9" * 4301 + b"}")  # json.loads raised ValueError here: a 500
    assert error.kind == "validation" and "number too large" in error.message
    assert refusal(b"1e999").kind == "validation"
    assert isinstance(parse_body(b"123456789012345678901234", None, LIMIT), float)
    assert parse_body(b"18446744073709551615", None, LIMIT) == 2**64 - 1


@pytest.mark.parametrize("raw", [b'"\\ud800"', b'["ok", {"k": "a\\udfff"}]', b'"\xed\xa0\x80"', b'"caf\xe9"',
                                 b"\xef\xbb\xbf\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"), b"NaN", b"{} x", b""])
def test_strings_must_be_valid_unicode_and_the_body_one_json_document(raw):
    error = refusal(raw)
    assert error.kind == "validation" and error.message


def test_a_utf8_byte_order_mark_is_ignored():
    assert parse_body(b"\xef\xbb\xbf{}", None, LIMIT) == {}


def test_a_valid_surrogate_pair_is_text():
    assert parse_body(b'"\\ud83d\\ude00"', None, LIMIT) == "\U0001F600"


BODY = json.dumps({"inputs": ["a crane is flying"] * 20}).encode()


@pytest.mark.parametrize("encoding, data", [
    ("gzip", gzip.compress(BODY)), ("x-gzip", gzip.compress(BODY)), ("GZip", gzip.compress(BODY)),
    ("deflate", zlib.compress(BODY)), ("deflate", zlib.compress(BODY, wbits=-zlib.MAX_WBITS)),
    ("identity", BODY), ("gzip, identity", gzip.compress(BODY)),
    ("deflate, gzip", gzip.compress(zlib.compress(BODY))),
    ("gzip", gzip.compress(BODY[:30]) + gzip.compress(BODY[30:])),  # two gzip members
])
def test_compressed_bodies_are_inflated(encoding, data):
    assert parse_body(data, encoding, LIMIT) == json.loads(BODY)


def test_a_zip_bomb_is_refused_at_the_body_limit():
    bomb = gzip.compress(b" " * (50 * LIMIT) + b"{}")  # 3 MB of spaces in a few KB
    assert len(bomb) < LIMIT // 4
    error = refusal(bomb, "gzip")
    assert error.kind == "payload_too_large" and str(LIMIT) in error.message
    assert parse_body(gzip.compress(b" " * (LIMIT - 10) + b"{}"), "gzip", LIMIT) == {}


@pytest.mark.parametrize("encoding", ["br", "foo", "gzip, br", "compress", "zstd"])
def test_unknown_codings_are_415(encoding):
    assert refusal(gzip.compress(BODY), encoding).kind == "unsupported_media_type"


@pytest.mark.parametrize("encoding, data", [("gzip", BODY), ("gzip", gzip.compress(BODY)[:-12]),
                                            ("deflate", b"\x78\x9c garbage"), ("deflate", zlib.compress(BODY) + b"x")])
def test_broken_compressed_bodies_are_422(encoding, data):
    assert refusal(data, encoding).kind == "validation"


CODINGS = st.sampled_from([None, "gzip", "deflate", "br", "identity", "gzip, gzip", "x-gzip", "", " , "])


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(max_size=512) | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
       encoding=CODINGS, compress=st.booleans())
def test_nothing_but_a_client_error_comes_out_of_the_parser(raw, encoding, compress):
    if compress and encoding in ("gzip", "x-gzip"):
        raw = gzip.compress(raw)
    try:
        parse_body(raw, encoding, 1024)
    except ServiceError as error:
        assert 400 <= STATUS[error.kind] < 500, error.kind
