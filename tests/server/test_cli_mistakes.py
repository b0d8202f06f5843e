"""Every mistake a new user makes is one line on stderr, exit status 2, naming the setting
and where its value came from; never a traceback. Each runs the CLI as a subprocess."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from proxy.core.policy import NOT_SETTINGS, Policy
from tests.server.cli_process import cli_env, cli_process, occupied_port, read_until, run_cli


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """The run's only stderr line, after checking it is a mistake's (status 2)."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_port_in_use(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    with occupied_port() as port:
        line = one_line(run_cli(["serve", "--port", str(port)], env))
        assert line == (
            f"compaction-proxy: server.host 127.0.0.1 (default), server.port {port} (flag"
            f" --port): 127.0.0.1:{port} is already in use (another compaction-proxy?);"
            " choose another with --port (0: any free port)"
        )
        line = one_line(run_cli(["serve"], {**env, "COMPACTION_PROXY_SERVER_PORT": str(port)}))
        assert f"server.port {port} (environment COMPACTION_PROXY_SERVER_PORT)" in line
        line = one_line(run_cli(["stand-in", "--port", str(port)], env))
        assert line == (
            f"compaction-proxy: stand-in --host 127.0.0.1 --port {port}: 127.0.0.1:{port} is"
            " already in use; choose another with --port"
        )
    # Refused before anything started: no embedded Redis was left behind.
    assert not (tmp_path / "state" / "compaction-proxy" / "redis" / "redis.pid").exists()


@pytest.mark.parametrize(
    ("args", "environ", "named"),
    [
        (
            ["--upstream", "https://api.anthropic.com/v1"],
            {},
            "upstream.url: must not end in /v1",
        ),
        (
            [],
            {"COMPACTION_PROXY_UPSTREAM_OPENAI_URL": "http://127.0.0.1:9/v1/"},
            "upstream.openai_url: must not end in /v1",
        ),
    ],
)
def test_an_upstream_url_ending_in_v1(
    tmp_path: Path, args: list[str], environ: dict[str, str], named: str
) -> None:
    line = one_line(run_cli(["serve", *args], cli_env(tmp_path, **environ)))
    assert line.startswith(f"compaction-proxy: bad setting: {named}")
    assert "(requests would go to /v1/v1/...)" in line
    source = "flag --upstream" if args else "environment COMPACTION_PROXY_UPSTREAM_OPENAI_URL"
    assert line.endswith(f"({source})")
    assert "use 'https://api.anthropic.com'" in line or "use 'http://127.0.0.1:9'" in line


def test_a_misspelled_variable_is_named_with_the_closest_setting(tmp_path: Path) -> None:
    env = cli_env(tmp_path, COMPACTION_PROXY_UPSTREAM_URLL="http://127.0.0.1:9")
    with cli_process(["serve", "--port", "0"], env) as child:
        lines = read_until(child.stderr, "listening on ")
    assert lines[0] == (
        "compaction-proxy: warning: environment COMPACTION_PROXY_UPSTREAM_URLL is not a"
        " setting and is ignored; the closest is COMPACTION_PROXY_UPSTREAM_URL\n"
    )
    assert "anthropic upstream https://api.anthropic.com," in lines[-1]  # ignored indeed
    assert child.returncode == 0


def test_log_level_after_the_command(tmp_path: Path, fixtures_dir: Path) -> None:
    request = fixtures_dir / "agent-requests" / "claude-code-turn1.json"
    after = ["audit", str(request), "--log-level", "debug"]
    for args in (after, ["--log-level", "ERROR", "audit", str(request)]):
        done = run_cli(args, cli_env(tmp_path))
        assert done.returncode == 0 and "tokens" in done.stdout, done.stderr
    line = one_line(run_cli(["serve", "--log-level", "LOUD"], cli_env(tmp_path)))
    assert line == (
        "compaction-proxy serve: argument --log-level: invalid choice: 'LOUD' (choose from"
        " 'DEBUG', 'INFO', 'WARNING', 'ERROR') (see compaction-proxy serve --help)"
    )
    line = one_line(run_cli(["serve", "--prot", "8080"], cli_env(tmp_path)))
    assert line == (
        "compaction-proxy: unrecognized arguments: --prot 8080 (see compaction-proxy --help)"
    )


FIELDS = ", ".join(f.name for f in dataclasses.fields(Policy) if f.name not in NOT_SETTINGS)


def test_a_policy_typo_lists_the_valid_fields(tmp_path: Path) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text('[[policy]]\nmatch = "claude-*"\ntriger = 100000\n')
    line = one_line(run_cli(["serve", "--config", str(config)], cli_env(tmp_path)))
    assert line == (
        "compaction-proxy: bad setting: policy #1 ('claude-*'): unknown field(s) 'triger'"
        f" (did you mean 'trigger'?); valid fields: {FIELDS} (file {config})"
    )
    # The same file, found by the default path, is named too.
    (tmp_path / "config").mkdir()
    config.rename(tmp_path / "config" / "proxy.toml")
    line = one_line(run_cli(["serve"], cli_env(tmp_path), cwd=tmp_path))
    assert line.endswith("(file config/proxy.toml)")


def missing_database(redis_url: str) -> str:
    """The test Redis's URL pointing at database 99, which it does not have."""
    if redis_url.startswith("unix://"):
        return redis_url.split("?")[0] + "?db=99"
    return redis_url.rsplit("/", 1)[0] + "/99" if redis_url.count("/") > 2 else redis_url + "/99"


def test_a_redis_database_that_does_not_exist(tmp_path: Path, redis_url: str) -> None:
    url = missing_database(redis_url)
    for command in (["serve", "--port", "0"], ["keys", "list"], ["budgets", "show", "--team", "t"]):
        line = one_line(run_cli([*command, "--redis-url", url], cli_env(tmp_path)))
        assert line == (
            f"compaction-proxy: store.redis_url {url} (flag --redis-url): database 99 does not"
            " exist on that Redis (it answered 'DB index is out of range'; its `databases`"
            " setting bounds the number)"
        )
    line = one_line(run_cli(["serve", "--port", "0"], cli_env(tmp_path, REDIS_URL=url)))
    assert f"store.redis_url {url} (environment REDIS_URL): database 99" in line
