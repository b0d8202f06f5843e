"""The real agents the end-to-end tests drive, installed from tests/agents/package.json.

`codex_bin` (session): the pinned Codex CLI; runs `npm ci` here when node_modules lacks it
(CI's .ci/run does the same up front), or takes `$CODEX_BIN`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from proxy.testing.codex_cli import AGENTS_DIR, codex_binary


@pytest.fixture(scope="session")
def codex_bin() -> Path:
    binary = codex_binary()
    if not binary.exists() and "CODEX_BIN" not in os.environ:
        npm = shutil.which("npm")
        assert npm, "npm is needed to install the pinned Codex CLI (tests/agents/package.json)"
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=AGENTS_DIR, check=True, timeout=900
        )
    assert binary.exists(), f"no Codex CLI at {binary}"
    version = subprocess.run(
        [str(binary), "--version"], capture_output=True, text=True, check=True, timeout=60
    )
    assert version.stdout.startswith("codex-cli "), version.stdout
    return binary
