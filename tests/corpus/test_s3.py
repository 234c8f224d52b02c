"""s3:// inputs against a local S3-compatible server (moto's server mode, started here on a free port): listing a
prefix and a glob, planning with byte offsets, reading units by ranged reads, with the credentials and the
endpoint taken from the environment as a user would set them, or from storage options."""

from __future__ import annotations

import gzip
import io
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from corpus.errors import CorpusError
from corpus.inputs import resolve_inputs
from corpus.plan import make_plan
from corpus.readers import Document, read_unit
from tests.conftest import wikitext_lines
from tests.optional import required_or_skip

required_or_skip("moto.server", "BERT_REQUIRE_MOTO", "moto (requirements/dev.txt) is the local S3 server")
from tests.corpus.object_store import BUCKET, local_store, use_store  # noqa: E402
from tests.corpus.object_store import client as store_client  # noqa: E402


@pytest.fixture(scope="module")
def endpoint():
    with local_store() as url:
        yield url


@pytest.fixture
def s3_env(endpoint, monkeypatch):
    """Fake credentials and the endpoint in this test's environment only (no ~/.aws, no real account)."""
    use_store(monkeypatch, endpoint)
    return endpoint


@pytest.fixture(scope="module")
def corpus(endpoint):
    """A bucket with a JSONL file, a gzipped text file, a Parquet file and a stray marker, written with
    plain boto3 (what a user's upload would be), and the texts they hold."""
    client = store_client(endpoint)
    texts = wikitext_lines("valid", limit=60)
    jsonl = "".join(json.dumps({"id": f"w{i}", "text": t}) + "\n" for i, t in enumerate(texts)).encode()
    client.put_object(Bucket=BUCKET, Key="data/wiki.jsonl", Body=jsonl)
    client.put_object(Bucket=BUCKET, Key="data/more/wiki.txt.gz", Body=gzip.compress("\n".join(texts).encode()))
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), buffer, row_group_size=16)
    client.put_object(Bucket=BUCKET, Key="data/wiki.parquet", Body=buffer.getvalue())
    client.put_object(Bucket=BUCKET, Key="data/_SUCCESS", Body=b"")
    return texts


def documents(units, **columns) -> list[Document]:
    items = [item for unit in units for item in read_unit(unit, columns.get("text"), columns.get("id"))]
    assert all(isinstance(item, Document) for item in items)
    return items


def test_a_prefix_and_a_glob_list_the_files(s3_env, corpus):
    files = resolve_inputs(f"s3://{BUCKET}/data/")
    assert [(f.uri, f.name, f.format, f.compression) for f in files] == [
        (f"s3://{BUCKET}/data/more/wiki.txt.gz", "more/wiki.txt.gz", "text", "gzip"),
        (f"s3://{BUCKET}/data/wiki.jsonl", "wiki.jsonl", "jsonl", None),
        (f"s3://{BUCKET}/data/wiki.parquet", "wiki.parquet", "parquet", None)]
    assert all("etag=" in f.fingerprint for f in files)  # a changed object is told by its ETag
    assert [f.name for f in resolve_inputs(f"s3://{BUCKET}/data/*.jsonl")] == ["wiki.jsonl"]
    assert [f.name for f in resolve_inputs(f"s3://{BUCKET}/data/**/*.gz")] == ["more/wiki.txt.gz"]


def test_jsonl_by_s3_uri_seeks_to_each_unit(s3_env, corpus):
    files = resolve_inputs(f"s3://{BUCKET}/data/wiki.jsonl")
    units = make_plan(files, 7)
    assert len(units) == 9 and all(u.byte_offset for u in units[1:])
    items = documents(units, id="id")
    assert [d.text for d in items] == corpus and [d.doc_id for d in items] == [f"w{i}" for i in range(60)]
    assert items[8].source == f"s3://{BUCKET}/data/wiki.jsonl" and items[8].row == 9


def test_parquet_and_gzip_by_s3_uri(s3_env, corpus):
    parquet, text = resolve_inputs(f"s3://{BUCKET}/data/wiki.parquet"), resolve_inputs(f"s3://{BUCKET}/data/more/")
    assert [d.text for d in documents(make_plan(parquet, 25), id="id")] == corpus
    assert [d.doc_id for d in documents(make_plan(parquet, 25), id="id")][-1] == "59"
    assert [d.text for d in documents(make_plan(text, 25))] == corpus


def test_storage_options_name_the_endpoint_without_the_environment(endpoint, corpus, monkeypatch):
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    files = resolve_inputs(f"s3://{BUCKET}/data/wiki.jsonl", storage_options=options)
    items = [item for unit in make_plan(files, 50, storage_options=options)
             for item in read_unit(unit, None, None, storage_options=options)]
    assert [d.text for d in items] == corpus


def test_a_missing_key_or_bucket_is_one_line(s3_env, corpus):
    with pytest.raises(CorpusError) as caught:
        resolve_inputs(f"s3://{BUCKET}/nothing/here.jsonl")
    assert str(caught.value).startswith(f"s3://{BUCKET}/nothing/here.jsonl: no such file or directory (check")
    with pytest.raises(CorpusError, match="no such file or directory|cannot list"):
        resolve_inputs("s3://no-such-bucket/x.jsonl")
