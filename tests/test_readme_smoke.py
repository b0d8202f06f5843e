"""The CI smoke step (.ci/readme_smoke.py) reads the set-up command from README.md and the
install step from the Dockerfile; these check it reads what a person reads there."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def smoke() -> ModuleType:
    spec = importlib.util.spec_from_file_location("readme_smoke", ROOT / ".ci" / "readme_smoke.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_it_reads_the_readme_set_up_command() -> None:
    readme = (ROOT / "README.md").read_text()
    command = smoke().setup_command(readme)
    assert command.startswith("python3 -m venv .venv && .venv/bin/pip install")
    assert command.endswith("compaction-proxy serve")
    first_block = readme.split("## Set-up", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    assert command == first_block.strip()  # the first command a new user sees, as written


def test_it_reads_the_dockerfile_install_step() -> None:
    install, copied = smoke().docker_install((ROOT / "Dockerfile").read_text())
    assert install == "pip install --no-cache-dir ."  # no extras: what the smoke step proves
    assert copied == ["pyproject.toml", "README.md", "proxy"]


def test_a_readme_without_the_command_fails_the_step() -> None:
    module = smoke()
    with pytest.raises(module.SmokeFailure, match="no ```sh block"):
        module.setup_command("# x\n\n## Set-up\n\nRun it.\n\n## Next\n")
    with pytest.raises(module.SmokeFailure, match="does not start serve"):
        module.setup_command("# x\n\n## Set-up\n\n```sh\npip install .\n```\n")
