"""An S3-compatible server on loopback (moto's) for the object-storage tests: a bucket named
`runs`, and the fake credentials the AWS SDK needs to find (moto accepts any)."""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator

FAKE_AWS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",  # never ask EC2's metadata service for credentials
}
BUCKET = "runs"


@contextlib.contextmanager
def s3_server() -> Iterator[str]:
    """Start the server and create the bucket; yields HOST:PORT. This process's environment has
    the fake credentials while it runs (child processes need them passed: `FAKE_AWS`)."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in FAKE_AWS}
    os.environ.update(FAKE_AWS)
    try:
        host, port = server.get_host_and_port()
        boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        yield f"{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bucket_uri(endpoint: str, prefix: str) -> str:
    """s3://runs/PREFIX with the query pyarrow needs to reach the server."""
    return f"s3://{BUCKET}/{prefix}?endpoint_override={endpoint}&scheme=http&region=us-east-1"
