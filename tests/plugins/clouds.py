"""Fixtures for the proxy's own cloud credentials (Bedrock's, Vertex AI's), in the
environment as an operator gives them, never the machine's own.

- `aws_env`: no AWS credentials anywhere (no variables, files or metadata server);
- `cloud_credentials`: the stand-ins' test credentials: AWS keys and region in the
  environment, and GOOGLE_APPLICATION_CREDENTIALS naming a service-account file (its
  path is returned: write it, with the stand-in's token endpoint, once that runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.server.bedrock_auth import BEARER_ENV
from proxy.testing.aws_sigv4 import TEST_CREDENTIALS

AWS_VARIABLES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    BEARER_ENV,
)


@pytest.fixture
def aws_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An environment with no AWS credentials anywhere (no files, no metadata server)."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path


@pytest.fixture
def cloud_credentials(aws_env: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_CREDENTIALS.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_CREDENTIALS.secret_key)
    monkeypatch.setenv("AWS_SESSION_TOKEN", TEST_CREDENTIALS.token or "")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    account = aws_env / "service-account.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(account))
    return account
