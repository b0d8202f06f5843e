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
        "budgets", "set", "--team", "infra", "--window", "9000", "--trigger", "6000",
        "--target", "3000",
    )  # fmt: skip
    assert shown["policy"] == {"window": 9000, "trigger": 6000, "target": 3000}
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


def test_a_policy_no_model_could_use_is_refused_when_set(run: Any) -> None:
    """`--target 150000` alone sits above claude-*'s trigger (140,000): every request of
    the key would fail its policy. Refused when set, with what to do instead."""
    code, created, _ = run("keys", "create", "--team", "policies")
    key_id = created["id"]
    code, _, err = run("budgets", "set", "--key", key_id, "--target", "150000")
    assert code == 2
    assert "claude-*" in err and "150000" in err and "--trigger" in err
    code, shown, _ = run("budgets", "show", "--key", key_id)
    assert shown["policy"] == {}  # nothing was stored
    # The same target with a trigger and window that hold it is fine for every model.
    code, shown, _ = run(
        "budgets", "set", "--key", key_id, "--window", "400000", "--trigger", "300000",
        "--target", "150000",
    )  # fmt: skip
    assert code == 0 and shown["policy"]["target"] == 150000
    # A team's policy is checked under its keys' own: a team trigger below the key's
    # target (150,000) would break the key's requests.
    code, _, err = run("budgets", "set", "--team", "policies", "--trigger", "100000")
    assert code == 0  # the key's own trigger (300,000) is over the team's: it still fits
    code, _, err = run("budgets", "set", "--key", key_id, "--trigger", "0")
    assert code == 2 and "target (150000) must be below trigger (100000)" in err


def test_keys_are_made_for_one_provider_and_scopes(run: Any) -> None:
    code, made, _ = run("keys", "create", "--team", "red", "--provider", "openai")
    assert code == 0
    assert (made["provider"], made["upstream_env"], made["upstream_scheme"]) == (
        "openai",
        "OPENAI_API_KEY",
        "bearer",
    )
    assert made["scopes"] == ""  # the metered routes only
    code, made, _ = run("keys", "create", "--team", "red", "--scope", "files", "--scope", "batches")
    assert (made["provider"], made["scopes"]) == ("anthropic", "files,batches")
    with pytest.raises(SystemExit) as refused:  # argparse names the known scopes
        run("keys", "create", "--team", "red", "--scope", "everything")
    assert refused.value.code == 2
