"""A local S3-API server for tests: moto's server mode in a subprocess (a test dependency,
pinned in requirements.lock), so builds, Ray workers on other raylets and subprocess
drivers all reach one bucket store over HTTP, as they would reach S3. No network."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``with S3Server() as s3: s3.env`` -- the variables that point boto3 / s3fs at it."""

    def __init__(self):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {**CREDENTIALS, "AWS_ENDPOINT_URL": self.endpoint, "AWS_ENDPOINT_URL_S3": self.endpoint}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> S3Server:
        self.process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **self.env})
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint, timeout=1).read()
                return self
            except OSError:
                if self.process.poll() is not None or time.time() > deadline:
                    self.__exit__()
                    raise RuntimeError("the moto S3 server did not start") from None
                time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def filesystem(self):
        """A fresh s3fs filesystem on this server (not fsspec's cached instance)."""
        import s3fs

        return s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=self.endpoint, skip_instance_cache=True,
                                 use_listings_cache=False)
