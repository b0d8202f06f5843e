"""Settings: defaults, the documented file, precedence, and errors that name the setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.cli import main
from proxy.config import ConfigError, Settings, load_settings

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.toml"
    path.write_text(text)
    return path


def test_documented_file_equals_the_builtin_defaults() -> None:
    assert load_settings(REPO / "config" / "proxy.toml", environ={}) == Settings()


def test_the_generated_files_are_current() -> None:
    """config/proxy.toml, the table in docs/configuration.md and the ConfigMap say what
    proxy/config.py declares."""
    from proxy.config_files import expected

    for path, text in expected().items():
        assert path.read_text() == text, f"{path} drifted: python3 -m proxy.config_files --write"


def test_each_setting_is_declared_once_with_its_doc_and_check() -> None:
    from proxy.config import DECLARED, declared

    names = [d.name for d in declared()]
    assert len(names) == len(set(names)) > 30
    assert set(DECLARED) == {"server", "upstream", "store", "auth", "budgets", "responses"}
    for d in declared():
        assert d.kind in (str, int, float), d.name
        assert isinstance(d.default, d.kind), d.name
        assert d.doc.endswith((".", ")")), d.name
        assert d.check(d.default) is None, f"{d.name}: its default fails its own check"
    assert DECLARED["server"]["port"].check(70000) == (
        "must be a port number 0-65535 (0 = any free port)"
    )


def test_a_later_source_mends_an_earlier_wrong_value(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nport = 70000\n")
    assert load_settings(path, environ={"COMPACTION_PROXY_SERVER_PORT": "81"}).server.port == 81


def test_no_file_gives_the_builtin_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./config/proxy.toml here
    settings = load_settings(environ={})
    assert settings == Settings()
    assert (settings.server.host, settings.server.port) == ("127.0.0.1", 8080)
    assert settings.upstream.url == "https://api.anthropic.com"
    assert settings.server.max_body_bytes == 32 * 1024 * 1024


def test_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = write(tmp_path, '[server]\nport = 9000\nhost = "0.0.0.0"\n[store]\nop_timeout = 2\n')
    environ = {"COMPACTION_PROXY_SERVER_PORT": "9001", "COMPACTION_PROXY_STORE_TTL": "60"}
    settings = load_settings(path, environ=environ, overrides={"server.port": 9002})
    assert settings.server.port == 9002
    assert settings.server.host == "0.0.0.0"
    assert settings.store.op_timeout == 2.0
    assert settings.store.ttl == 60
    assert load_settings(path, environ=environ).server.port == 9001


def test_redis_url_alias_loses_to_the_prefixed_variable() -> None:
    assert load_settings(environ={"REDIS_URL": "redis://a:6379"}).store.redis_url == (
        "redis://a:6379"
    )
    both = {"REDIS_URL": "redis://a:6379", "COMPACTION_PROXY_STORE_REDIS_URL": "redis://b:1"}
    assert load_settings(environ=both).store.redis_url == "redis://b:1"


def test_config_file_from_the_environment(tmp_path: Path) -> None:
    path = write(tmp_path, '[upstream]\nurl = "http://127.0.0.1:1"\n')
    settings = load_settings(environ={"COMPACTION_PROXY_CONFIG": str(path)})
    assert settings.upstream.url == "http://127.0.0.1:1"


def test_policies_are_kept_and_checked(tmp_path: Path) -> None:
    text = (
        '[[policy]]\nmatch = "claude-*"\ntrigger = 105000\ntarget = 37000\n'
        '[[policy]]\nmatch = "x"\n'
    )
    settings = load_settings(write(tmp_path, text), environ={})
    assert settings.policies == (
        {"match": "claude-*", "trigger": 105000, "target": 37000},
        {"match": "x"},
    )
    # Parsed once, there: yours, then the built-in one.
    from proxy.core.policy import DEFAULT_POLICIES, Policy

    assert settings.model_policies == (
        Policy(match="claude-*", window=0, trigger=105000, target=37000),
        Policy(match="x", window=0),
        *DEFAULT_POLICIES,
    )


@pytest.mark.parametrize(
    ("text", "environ", "overrides", "named"),
    [
        ("[server]\nprot = 1\n", {}, {}, "server.prot: unknown setting"),
        ("[serve]\nport = 1\n", {}, {}, "serve: unknown section"),
        ("policy = 3\n", {}, {}, "policy: must be [[policy]] tables"),
        ('[[policy]]\nmodel = "x"\n', {}, {}, "policy #1: unknown field"),
        ("[[policy]]\ntrigger = 9\ntarget = 10\n", {}, {}, "must be below trigger"),
        ('[server]\nport = "80"\n', {}, {}, "server.port: expected int"),
        ("[server]\nport = true\n", {}, {}, "server.port: expected int"),
        ("[server]\nport = 70000\n", {}, {}, "server.port: must be a port number"),
        ("", {"COMPACTION_PROXY_SERVER_PORT": "eighty"}, {}, "COMPACTION_PROXY_SERVER_PORT"),
        ("", {}, {"upstream.url": "api.anthropic.com"}, "upstream.url: must be an http"),
        ("[upstream]\nstream_idle_timeout = 0\n", {}, {}, "upstream.stream_idle_timeout"),
        ('[store]\nredis_url = "mysql://x"\n', {}, {}, "store.redis_url"),
        ('[store]\nkey_prefix = "a{b}"\n', {}, {}, "store.key_prefix"),
        ("", {"REDIS_URL": "redis://host:port/0"}, {}, "store.redis_url: has a bad port"),
        ("[server\n", {}, {}, "not valid TOML"),
    ],
)
def test_wrong_settings_are_named(
    tmp_path: Path, text: str, environ: dict[str, str], overrides: dict[str, object], named: str
) -> None:
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace(".", r"\.")):
        load_settings(write(tmp_path, text), environ=environ, overrides=overrides)


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_state_dir_default_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert Settings().resolved_state_dir() == tmp_path / "compaction-proxy"
    settings = load_settings(environ={"COMPACTION_PROXY_STORE_STATE_DIR": "~/x"})
    assert settings.resolved_state_dir() == Path.home() / "x"


def test_cli_stops_on_a_wrong_setting(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["serve", "--upstream", "ftp://nowhere", "--config", str(REPO / "config/proxy.toml")])
        == 2
    )
    assert "upstream.url" in capsys.readouterr().err


def test_the_documented_policy_is_the_builtin_one(tmp_path: Path) -> None:
    from proxy.core.policy import DEFAULT_POLICIES, parse_policies

    text = (REPO / "config" / "proxy.toml").read_text()
    block = text[text.index("# [[policy]]") : text.index("# Optional prices per model")]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    settings = load_settings(write(tmp_path, uncommented), environ={})
    assert parse_policies(settings.policies) == [DEFAULT_POLICIES[0]]


def test_the_documented_price_example_parses(tmp_path: Path) -> None:
    text = (REPO / "config" / "proxy.toml").read_text()
    block = text[text.index("\n# [[price]]\n") :]
    uncommented = "\n".join(line.removeprefix("# ") for line in block.splitlines())
    settings = load_settings(write(tmp_path, uncommented), environ={})
    rates = settings.prices.rates_for("claude-sonnet-4-6")
    assert rates is not None and rates.unit == "USD"
    assert rates.output * 1_000_000 == 15.0


def test_a_wrong_price_table_stops_start_up(tmp_path: Path) -> None:
    path = write(tmp_path, '[[price]]\nmatch = "x"\ninput = 1\n')
    with pytest.raises(ConfigError, match="output is required"):
        load_settings(path, environ={})


def test_every_variable_the_docs_and_deployments_name_is_known() -> None:
    """None of them would get the misspelled-variable warning."""
    import re

    from proxy.config import misspelled_variables

    named: set[str] = set()
    for path in [REPO / "README.md", *(REPO / "docs").glob("*.md"), REPO / "Dockerfile",
                 REPO / "docker-compose.yml",
                 *(REPO / "deploy").rglob("*.yaml"), *(REPO / "config").iterdir()]:  # fmt: skip
        named.update(re.findall(r"COMPACTION_PROXY_[A-Z0-9_]+", path.read_text()))
    named -= {"COMPACTION_PROXY_SECTION_KEY"}  # the README's pattern, not a variable
    assert {"COMPACTION_PROXY_ADMIN_KEY", "COMPACTION_PROXY_SERVER_PORT"} <= named
    assert misspelled_variables(dict.fromkeys(named, "x")) == []
    warned = misspelled_variables({"COMPACTION_PROXY_SERVER_PROT": "1"})
    assert warned == [
        "environment COMPACTION_PROXY_SERVER_PROT is not a setting and is ignored; the closest"
        " is COMPACTION_PROXY_SERVER_PORT"
    ]


def test_the_variable_the_admin_key_setting_names_is_not_warned_of(tmp_path: Path) -> None:
    warnings: list[str] = []
    environ = {
        "COMPACTION_PROXY_AUTH_ADMIN_KEY_ENV": "COMPACTION_PROXY_OPS_KEY",
        "COMPACTION_PROXY_OPS_KEY": "secret",
        "COMPACTION_PROXY_STORE_TTLL": "5",
    }
    load_settings(write(tmp_path, ""), environ=environ, warn=warnings.append)
    assert warnings == [
        "environment COMPACTION_PROXY_STORE_TTLL is not a setting and is ignored; the closest"
        " is COMPACTION_PROXY_STORE_TTL"
    ]
