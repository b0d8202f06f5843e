"""`compaction-proxy models`: the snapshot is made from the maintained tables by a
command, not typed by hand (issue 23, finding 3)."""

from __future__ import annotations

import json
from pathlib import Path

from proxy.ops.models import build, render
from tests.server.cli_process import cli_env, run_cli

LITELLM = {
    "sample_spec": {"max_input_tokens": "max input"},
    "claude-wide-9": {
        "litellm_provider": "anthropic",
        "mode": "chat",
        "max_input_tokens": 1_000_000,
        "max_output_tokens": 128_000,
        "input_cost_per_token": 3e-06,
        "output_cost_per_token": 1.5e-05,
        "cache_read_input_token_cost": 3e-07,
        "cache_creation_input_token_cost": 3.75e-06,
    },
    "claude-narrow-9": {
        "litellm_provider": "anthropic",
        "mode": "chat",
        "max_input_tokens": 200_000,
        "max_output_tokens": 64_000,
        "input_cost_per_token": 1e-06,
        "output_cost_per_token": 5e-06,
    },
    # The same model under another provider, priced past 200k: it reaches 1M with the beta.
    "anthropic.claude-narrow-9-20260101-v1:0": {
        "litellm_provider": "bedrock_converse",
        "mode": "chat",
        "max_input_tokens": 200_000,
        "input_cost_per_token_above_200k_tokens": 6e-06,
    },
    "gpt-9": {
        "litellm_provider": "openai",
        "mode": "responses",
        "max_input_tokens": 1_050_000,
        "max_output_tokens": 128_000,
        "input_cost_per_token": 5e-06,
        "output_cost_per_token": 3e-05,
    },
    # The Gemini API's models, under LiteLLM's `gemini/` prefix (and once without it).
    "gemini/gemini-9-flash": {
        "litellm_provider": "gemini",
        "mode": "chat",
        "max_input_tokens": 1_048_576,
        "max_output_tokens": 65_536,
        "input_cost_per_token": 5e-07,
        "output_cost_per_token": 3e-06,
        "cache_read_input_token_cost": 5e-08,
        "input_cost_per_token_above_200k_tokens": 1e-06,
    },
    "gemini-9-flash": {"litellm_provider": "gemini", "mode": "chat", "max_input_tokens": 2_097_152},
    "gemini-9-flash-vertex": {
        "litellm_provider": "vertex_ai-language-models",
        "mode": "chat",
        "max_input_tokens": 5,
    },
    "text-embedding-9": {"litellm_provider": "openai", "mode": "embedding", "max_input_tokens": 8},
    "azure/gpt-9": {"litellm_provider": "azure", "mode": "chat", "max_input_tokens": 5},
}


def test_the_snapshot_is_built_from_the_tables() -> None:
    rows = build(LITELLM, {"gpt-9": (400_000, False), "gemini-9-flash": (1_000_000, True)})
    assert set(rows) == {"claude-wide-9", "claude-narrow-9", "gpt-9", "gemini-9-flash"}
    # The second opinion's smaller window; a price tier is no beta outside Claude.
    assert rows["gemini-9-flash"] == (1_000_000, 65_536, 0, 0.5, 3.0, 0.05, None, None)
    assert rows["claude-wide-9"] == (1_000_000, 128_000, 0, 3.0, 15.0, 0.3, 3.75, None)
    assert rows["claude-narrow-9"][:3] == (200_000, 64_000, 1_000_000)
    assert rows["gpt-9"][0] == 400_000  # the tables disagree: the smaller window
    namespace: dict[str, object] = {}
    exec(render(rows, "test source", "genai-prices test", "2026-12-01"), namespace)
    assert namespace["ROWS"] == rows and namespace["MADE"] == "2026-12-01"


def test_models_refresh_writes_a_snapshot_and_models_show_reads_the_vendored_one(
    tmp_path: Path,
) -> None:
    source = tmp_path / "prices.json"
    source.write_text(json.dumps(LITELLM))
    out = tmp_path / "snapshot.py"
    done = run_cli(
        ["models", "refresh", "--from", str(source), "--label", "test 1.0", "--out", str(out)],
        cli_env(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    assert "wrote 4 models" in done.stdout
    text = out.read_text()
    assert "(test 1.0)" in text and '"claude-narrow-9": (200_000, 64_000, 1_000_000,' in text
    shown = run_cli(["models", "show", "claude-opus-5-5", "claude-test-1"], cli_env(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "claude-opus-5-5: max input 1,000,000, max output 128,000" in shown.stdout
    assert "claude-test-1: not in the table (a default window of 200,000 applies)" in shown.stdout


def test_plan_and_audit_say_which_window_applies_and_where_it_came_from(tmp_path: Path) -> None:
    fixture = Path(__file__).parents[1] / "fixtures" / "agent-requests" / "claude-code-turn7.json"
    audited = run_cli(["audit", str(fixture)], cli_env(tmp_path))
    assert audited.returncode == 0, audited.stderr
    assert "window 1,000,000 (model table (claude-opus-5-5))" in audited.stdout
    body = {
        "model": "claude-sonnet-4-5-20250929",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    request = tmp_path / "request.json"
    request.write_text(json.dumps(body))
    plain = run_cli(["plan", str(request)], cli_env(tmp_path))
    assert plain.returncode == 0, plain.stderr
    assert "window 200,000 (model table (claude-sonnet-4-5-20250929))" in plain.stdout
    beta = ["--anthropic-beta", "context-1m-2025-08-07"]
    wide = run_cli(["plan", str(request), *beta], cli_env(tmp_path))
    assert wide.returncode == 0, wide.stderr
    assert "window 1,000,000 (model table (claude-sonnet-4-5-20250929, with the context-1m" in (
        wide.stdout
    )
    # A recorded request's own header counts too.
    recorded = tmp_path / "recorded.json"
    headers = {"anthropic-beta": "context-1m-2025-08-07"}
    recorded.write_text(json.dumps({"method": "POST", "headers": headers, "body": body}))
    own = run_cli(["plan", str(recorded)], cli_env(tmp_path))
    assert "window 1,000,000" in own.stdout, own.stdout + own.stderr
