"""The README's recipes, followed as written: the stand-in serving both SDKs through
`serve --upstream ... --openai-upstream ...`, and a proxy key for an OpenAI client."""

from __future__ import annotations

from pathlib import Path

import anthropic
import openai
import orjson
import pytest

from tests.plugins.standin import RunningStandIn
from tests.server.cli_process import cli_env, cli_process, read_until, run_cli


def listening_url(line: str) -> str:
    return line.split("listening on ")[1].split(",")[0].strip()


def test_the_stand_in_serves_both_sdks_through_the_proxy(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    with cli_process(["stand-in", "--port", "0"], env) as standin:
        standin_url = listening_url(read_until(standin.stdout, "listening on ")[-1])
        args = ["serve", "--port", "0", "--upstream", standin_url]
        with cli_process([*args, "--openai-upstream", standin_url], env) as serve:
            url = listening_url(read_until(serve.stderr, "listening on ")[-1])
            claude = anthropic.Anthropic(base_url=url, api_key="any-key", max_retries=0)
            reply = claude.messages.create(
                model="claude-sonnet-4-6",
                max_tokens=64,
                messages=[{"role": "user", "content": "Hi"}],
            )
            assert reply.content[0].type == "text" and reply.usage.input_tokens > 0
            gpt = openai.OpenAI(base_url=f"{url}/v1", api_key="any-key", max_retries=0)
            completion = gpt.chat.completions.create(
                model="gpt-5-mini", messages=[{"role": "user", "content": "Hi"}]
            )
            assert completion.choices[0].message.content
            assert completion.usage is not None and completion.usage.prompt_tokens > 0


def test_a_proxy_key_for_an_openai_client(tmp_path: Path, standin_thread: RunningStandIn) -> None:
    upstream_key = "sk-openai-for-the-proxy"
    env = cli_env(tmp_path, COMPACTION_PROXY_AUTH_KEYS="required", OPENAI_API_KEY=upstream_key)
    args = ["serve", "--port", "0", "--openai-upstream", standin_thread.url]
    with cli_process(args, env) as serve:
        url = listening_url(read_until(serve.stderr, "listening on ")[-1])
        created = run_cli(
            [
                "keys",
                "create",
                "--team",
                "apps",
                "--provider",
                "openai",
                "--json",
            ],
            env,
        )
        assert created.returncode == 0, created.stderr
        key = orjson.loads(created.stdout)["key"]

        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)
        completion = client.chat.completions.create(
            model="gpt-5-mini", messages=[{"role": "user", "content": "Hi"}]
        )
        assert completion.choices[0].message.content
        sent = [r for r in standin_thread.recorded if r.path_qs == "/v1/chat/completions"]
        assert sent[-1].headers.get("Authorization") == f"Bearer {upstream_key}"
        assert all(key not in str(r.headers) for r in standin_thread.recorded)

        stranger = openai.OpenAI(base_url=f"{url}/v1", api_key="cpk_wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            stranger.chat.completions.create(
                model="gpt-5-mini", messages=[{"role": "user", "content": "Hi"}]
            )
        assert refused.value.status_code == 401
