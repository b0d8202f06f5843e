"""`compaction-proxy keys ...` and `budgets ...` against a real Redis, as an operator runs
them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.cli import main


@pytest.fixture
def run(
    tmp_path: Path, redis_url: str, redis_key_prefix: str, capsys: pytest.CaptureFixture[str]
) -> Any:
    config = tmp_path / "proxy.toml"
    config.write_text(f'[store]\nkey_prefix = "{redis_key_prefix}"\n')

    def run(*argv: str) -> tuple[int, Any, str]:
        code = main([*argv, "--config", str(config), "--redis-url", redis_url, "--json"])
        out, err = capsys.readouterr()
        return code, orjson.loads(out) if out.strip() else None, err

    return run


def test_create_list_revoke_and_budgets(run: Any) -> None:
    code, created, _ = run("keys", "create", "--team", "infra", "--name", "ci bot")
    assert code == 0 and created["key"].startswith("cpk_") and "digest" not in created
    key_id = created["id"]
    code, listed, _ = run("keys", "list")
    assert [(k["id"], k["team"], k["revoked"]) for k in listed] == [(key_id, "infra", "0")]
    assert all(created["key"] not in str(v) for k in listed for v in k.values())

    code, shown, _ = run(
        "budgets",
        "set",
        "--key",
        key_id,
        "--period",
        "minute",
        "--input",
        "5000",
        "--output",
        "800",
    )
    assert code == 0 and shown["limits"]["minute"] == {"input": 5000, "output": 800}
    code, shown, _ = run(
        "budgets", "set", "--team", "infra", "--period", "month", "--weighted", "9"
    )
    assert shown["limits"]["month"] == {"weighted": 9} and shown["used"]["month"]["weighted"] == 0
    code, shown, _ = run(
        "budgets", "set", "--team", "infra", "--window", "9000", "--trigger", "6000"
    )
    assert shown["policy"] == {"window": 9000, "trigger": 6000}
    code, shown, _ = run("budgets", "set", "--key", key_id, "--period", "minute", "--input", "-1")
    assert shown["limits"]["minute"] == {"output": 800}
    code, shown, _ = run("budgets", "show", "--key", key_id)
    assert code == 0 and shown["scope"] == f"key {key_id}"

    code, _, _ = run("keys", "revoke", key_id)
    assert code == 0
    code, listed, _ = run("keys", "list")
    assert listed[0]["revoked"] == "1"


def test_operator_mistakes_are_named(run: Any) -> None:
    code, _, err = run("budgets", "set", "--team", "x", "--input", "5")
    assert code == 2 and "--period" in err
    code, _, err = run("budgets", "set", "--team", "x", "--trigger", "5000", "--target", "6000")
    assert code == 2 and "target" in err
    code, _, err = run("budgets", "show", "--key", "000000000000")
    assert code == 1 and "no key" in err
    code, _, err = run("keys", "revoke", "000000000000")
    assert code == 1
    code, _, err = run("keys", "create", "--team", "bad team")
    assert code == 2 and "team" in err
