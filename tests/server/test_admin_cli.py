"""`compaction-proxy keys ...` and `budgets ...` against a real Redis, and with `--url`
against a proxy's admin API, as an operator runs them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.admin_client import ADMIN_KEY_ENV as ADMIN_KEY_ENV_FOR_CLI
from proxy.cli import main
from proxy.server.app import RunningProxy
from tests.plugins.standin import RunningStandIn
from tests.server.conftest import ADMIN_KEY_ENV


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
    """`--target 150000` alone sits above the built-in trigger (60,000): every request of
    the key would fail its policy. Refused when set, with what to do instead."""
    code, created, _ = run("keys", "create", "--team", "policies")
    key_id = created["id"]
    code, _, err = run("budgets", "set", "--key", key_id, "--target", "150000")
    assert code == 2
    assert "models matching '*'" in err and "150000" in err and "trigger" in err
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


@pytest.fixture
def run_url(
    admin_key: str,
    monkeypatch: pytest.MonkeyPatch,
    standin_thread: RunningStandIn,
    make_proxy_thread: Callable[..., RunningProxy],
    redis_key_prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> Any:
    """The commands with --url against a proxy's admin API (its Redis not given)."""
    proxy = make_proxy_thread(
        standin_thread.url,
        **{"auth.admin_key_env": ADMIN_KEY_ENV, "store.key_prefix": redis_key_prefix},
    )
    monkeypatch.setenv(ADMIN_KEY_ENV_FOR_CLI, admin_key)

    def run(*argv: str, url: str = proxy.url) -> tuple[int, Any, str]:
        code = main([*argv, "--url", url, "--json"])
        out, err = capsys.readouterr()
        return code, orjson.loads(out) if out.strip() else None, err

    return run


def test_the_commands_work_through_the_admin_api(run_url: Any, run: Any) -> None:
    code, created, _ = run_url("keys", "create", "--team", "infra", "--name", "over http")
    assert code == 0 and created["key"].startswith("cpk_") and "digest" not in created
    key_id = created["id"]
    # The same record as the Redis commands see.
    assert [k["id"] for k in run("keys", "list")[1]] == [key_id]
    code, shown, _ = run_url(
        "budgets", "set", "--key", key_id, "--period", "day", "--input", "900", "--window",
        "9000", "--trigger", "6000", "--target", "3000",
    )  # fmt: skip
    assert code == 0 and shown["limits"]["day"] == {"input": 900}
    assert shown["policy"] == {"window": 9000, "trigger": 6000, "target": 3000}
    assert run("budgets", "show", "--key", key_id)[1]["limits"] == shown["limits"]
    code, shown, _ = run_url("budgets", "set", "--key", key_id, "--period", "day", "--input", "-1")
    assert shown["limits"]["day"] == {}
    code, listed, _ = run_url("keys", "list")
    assert [(k["id"], k["name"]) for k in listed] == [(key_id, "over http")]
    assert run_url("keys", "revoke", key_id)[0] == 0
    assert run("keys", "list")[1][0]["revoked"] == "1"

    code, _, err = run_url("budgets", "show", "--key", "000000000000")
    assert code == 1 and "no key" in err
    code, _, err = run_url("keys", "revoke", "000000000000")
    assert code == 1 and "no key" in err
    code, _, err = run_url("budgets", "set", "--team", "x", "--trigger", "5000", "--target", "6000")
    assert code == 2 and "target" in err
    code, _, err = run_url("keys", "list", url="http://127.0.0.1:1")
    assert code == 1 and "cannot reach" in err


def test_url_mistakes_are_named(
    run_url: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_url("keys", "list", url="ftp://x")
    assert code == 2 and "--url" in err
    monkeypatch.setenv(ADMIN_KEY_ENV_FOR_CLI, "not-the-admin-key-at-all")
    code, _, err = run_url("keys", "list")
    assert code == 1 and "401" in err and "invalid admin key" in err
    monkeypatch.delenv(ADMIN_KEY_ENV_FOR_CLI)
    code, _, err = run_url("keys", "list")
    assert code == 2 and ADMIN_KEY_ENV_FOR_CLI in err
