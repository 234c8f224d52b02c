"""A local S3-compatible store for the tests: moto's server mode on a free port, with fake credentials and the
endpoint given the way a user gives them (AWS_* variables, AWS_ENDPOINT_URL), and what a test needs to look into it."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

BUCKET = "corpus-test"
FAKE_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def local_store():
    """moto's S3 server on a free port, with BUCKET created: yields its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def environment(endpoint: str) -> dict[str, str]:
    """The variables a user of this store sets: credentials and the endpoint, and no ~/.aws."""
    return {**FAKE_CREDENTIALS, "AWS_ENDPOINT_URL": endpoint, "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull}


def use_store(monkeypatch, endpoint: str) -> None:
    """This test's environment (and the processes it starts) sees only the local store's variables."""
    for name in [n for n in os.environ if n.startswith("AWS_")]:
        monkeypatch.delenv(name)
    for name, value in environment(endpoint).items():
        monkeypatch.setenv(name, value)


def client(endpoint: str):
    """A plain boto3 client, as a user's own tools would reach the store."""
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                        aws_secret_access_key="testing")


def keys(endpoint: str, prefix: str) -> dict[str, bytes]:
    """Every object under `prefix` of BUCKET: key below the prefix -> its bytes."""
    s3 = client(endpoint)
    found = {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix.rstrip("/") + "/"):
        for item in page.get("Contents", []):
            relative = item["Key"][len(prefix.rstrip("/")) + 1:]
            found[relative] = s3.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
    return found


def download(endpoint: str, prefix: str, into: Path) -> Path:
    """The objects under `prefix` as files under `into` (the same relative names): the tests' readers then read
    an object-store output as they read a directory."""
    for relative, data in keys(endpoint, prefix).items():
        path = into / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return into
