"""What `serve` says when it starts, and the embedded store shared with `keys` and
`budgets` on one machine, run as a person runs them (subprocesses, their own HOME)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import orjson

from proxy.core.model_facts import BUILTIN
from proxy.store import EmbeddedRedis
from tests.plugins.standin import RunningStandIn
from tests.server.cli_process import cli_env, cli_process, read_until, run_cli


def processes_mentioning(text: str) -> list[str]:
    """Command lines of running processes that contain `text` (a state directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(cmdline)
    return found


def test_the_startup_line_says_what_the_proxy_does(
    tmp_path: Path, standin_thread: RunningStandIn
) -> None:
    config = tmp_path / "proxy.toml"
    config.write_text(
        '[[policy]]\nmatch = "claude-*"\ntrigger = 100000\ntarget = 40000\n'
        '[[policy]]\nmatch = "gpt-small"\nwindow = 64000\n'
    )
    args = ["serve", "--port", "0", "--config", str(config), "--upstream", standin_thread.url]
    with cli_process([*args, "--openai-upstream", standin_thread.url], cli_env(tmp_path)) as child:
        line = read_until(child.stderr, "listening on ")[-1]
    state = tmp_path / "state" / "compaction-proxy" / "redis"
    assert f"anthropic upstream {standin_thread.url}, openai upstream {standin_thread.url}," in line
    assert f", config {config}, store embedded Redis in {state}," in line
    assert (
        ", auth off (callers' own keys go upstream), policies 3 (2 from the file, 1 built-in),"
        in (line)
    )
    # Which window applies, and where it comes from.
    assert line.endswith(
        ", windows 64,000 for 'gpt-small' (its [[policy]]), others from the model table"
        f" ({BUILTIN.described}); a model not in it: 200,000 for claude*, 1,000,000 for gemini-*,"
        " 128,000 for *\n"
    )
    assert child.returncode == 0


def test_the_startup_line_masks_the_redis_password(tmp_path: Path, redis_url: str) -> None:
    url = redis_url.replace("://", "://:hunter2@", 1) if "@" not in redis_url else redis_url
    env = cli_env(tmp_path, COMPACTION_PROXY_AUTH_KEYS="required")
    with cli_process(["serve", "--port", "0", "--redis-url", url], env) as child:
        line = read_until(child.stderr, "listening on ")[-1]
    assert "hunter2" not in line and ":***@" in line
    assert ", config none (built-in defaults), store Redis " in line
    assert ", auth proxy keys required, policies 1 (0 from the file, 1 built-in)" in line
    assert f", windows every model from the model table ({BUILTIN.described});" in line


def test_keys_and_budgets_share_the_embedded_store_with_serve(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = str(tmp_path / "state")
    # No serve runs: the command starts the embedded Redis for itself, then stops it.
    created = run_cli(["keys", "create", "--team", "infra", "--json"], env)
    assert created.returncode == 0, created.stderr
    key = orjson.loads(created.stdout)
    assert not processes_mentioning(state)

    with cli_process(["serve", "--port", "0"], env) as serve:
        line = read_until(serve.stderr, "listening on ")[-1]
        url = line.split("listening on ")[1].split(",")[0]
        # A serve runs it: the commands use that one (and leave it running).
        shown = run_cli(["budgets", "set", "--team", "infra", "--window", "190000", "--json"], env)
        assert shown.returncode == 0, shown.stderr
        assert orjson.loads(shown.stdout)["policy"] == {"window": 190000}
        listed = run_cli(["keys", "list", "--json"], env)
        assert [k["id"] for k in orjson.loads(listed.stdout)] == [key["id"]]
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as ready:
            assert orjson.loads(ready.read())["store"] == "ok"

        # A second serve over the same state directory refuses, saying why and what to do.
        socket_url = EmbeddedRedis(tmp_path / "state" / "compaction-proxy" / "redis").url
        second = run_cli(["serve", "--port", "0"], env)
        assert second.returncode == 2
        assert second.stderr == (
            f"compaction-proxy: store.state_dir {tmp_path}/state/compaction-proxy (default):"
            f" another serve (pid {serve.pid}) runs the embedded Redis there; stop it, give this"
            " one its own state directory (COMPACTION_PROXY_STORE_STATE_DIR), or share that"
            f" Redis with --redis-url {socket_url}\n"
        )
    assert serve.returncode == 0
    assert not processes_mentioning(state), "serve stopped its redis-server"

    # What the commands wrote while serve ran was kept.
    listed = run_cli(["budgets", "show", "--team", "infra", "--json"], env)
    assert orjson.loads(listed.stdout)["policy"] == {"window": 190000}
    assert not processes_mentioning(state)
