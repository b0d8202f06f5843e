"""`plan` and `replay` in the request's own wire format: `--format anthropic|chat`, or
told apart from the body (proxy/ops/formats.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.cli import main
from proxy.core.tokens import TokenCounter
from proxy.ops.formats import looks_like_chat
from proxy.ops.replay import replay
from proxy.wire import CHAT
from proxy.wire.chat import ChatCounter
from tests.core.test_planner_chat import conversation
from tests.ops.test_simulate import POLICY, anthropic_request, chat_request

CONFIG = """[[policy]]
match = "*"
window = 20000
trigger = 8000
target = 4000
keep_last = 2
keep_results = 1
offload_threshold = 300
stub_head_chars = 200
note_cost = 60
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "chat.toml"
    path.write_text(CONFIG)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def offloaded_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("    r_")]


def test_chat_and_anthropic_bodies_are_told_apart(fixtures_dir: Path) -> None:
    assert looks_like_chat(chat_request(turns=2))
    assert looks_like_chat({"model": "gpt-4.1", "messages": conversation(0)})  # system first
    assert looks_like_chat({"messages": [{"role": "user", "content": "hi"}], "n": 1})
    assert not looks_like_chat(anthropic_request("Fix it", turns=2))
    for name in ("claude-code-turn1.json", "claude-code-turn7.json"):
        recorded = orjson.loads((fixtures_dir / "agent-requests" / name).read_bytes())
        body = recorded.get("body", recorded)
        assert not looks_like_chat(orjson.loads(body) if isinstance(body, str) else body)


def test_plan_of_a_chat_request_offloads_its_tool_messages(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: Path
) -> None:
    file = tmp_path / "chat.json"
    file.write_bytes(orjson.dumps(chat_request(turns=30)))
    for flags in ((), ("--format", "chat")):
        code, out = run(capsys, "plan", str(file), "--config", str(config), *flags)
        assert code == 0
        assert "format: chat (OpenAI Chat Completions)" in out
        assert "strategy: offload" in out
        lines = offloaded_lines(out)
        assert lines and all(" Read " in line for line in lines)  # each result's tool named
    # Read as Messages, the `tool` messages are no tool results: nothing to offload.
    code, out = run(capsys, "plan", str(file), "--config", str(config), "--format", "anthropic")
    assert code == 0
    assert "format: anthropic (Messages)" in out and not offloaded_lines(out)


def trace(turns: range) -> list[dict[str, Any]]:
    return [chat_request(turns=t) for t in turns]


def test_replay_of_a_chat_trace_prices_it_in_its_format(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: Path
) -> None:
    requests = trace(range(10, 40))
    result = replay(requests, [POLICY], TokenCounter(), fmt=CHAT)
    strategies = [t.strategy for t in result.turns]
    assert any(s.startswith("offload") for s in strategies) and "checkpoint" in strategies
    counter = ChatCounter(TokenCounter())  # priced as the Chat stand-in counts
    assert [t.direct_tokens for t in result.turns] == [counter.count_request(r) for r in requests]
    assert all(t.proxy_tokens <= t.window for t in result.turns)
    assert all(t.proxy_tokens < t.direct_tokens for t in result.turns if t.strategy)
    # Detected from the first request, the same figures.
    detected = replay(requests, [POLICY], TokenCounter())
    assert [t.proxy_cost for t in detected.turns] == [t.proxy_cost for t in result.turns]

    jsonl = tmp_path / "chat.jsonl"
    jsonl.write_bytes(b"\n".join(orjson.dumps(r) for r in requests) + b"\n")
    out_file = tmp_path / "report.html"
    code, out = run(capsys, "replay", str(jsonl), "--config", str(config), "--out", str(out_file))
    assert code == 0 and out_file.exists()
    code, forced = run(
        capsys, "replay", str(jsonl), "--config", str(config), "--format", "chat",
        "--out", str(tmp_path / "forced.html"),
    )  # fmt: skip
    assert code == 0
    assert out.splitlines()[:-1] == forced.splitlines()[:-1]  # all but the report's path


def test_codex_requests_are_planned_and_replayed_as_responses(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fixtures_dir: Path
) -> None:
    codex = fixtures_dir / "agent-requests"
    config = tmp_path / "codex.toml"
    config.write_text(
        '[[policy]]\nmatch = "*"\nwindow = 40000\ntrigger = 24000\ntarget = 16000\n'
        "keep_last = 2\nkeep_results = 1\n"
    )
    code, out = run(capsys, "plan", "--config", str(config), str(codex / "codex-turn6.json"))
    assert code == 0
    assert out.startswith("format: responses (OpenAI Responses)")
    assert "strategy: offload" in out
    assert all("exec_command" in line for line in offloaded_lines(out))
    trace = tmp_path / "trace"
    trace.mkdir()
    for n, name in enumerate(("codex-turn1", "codex-turn6"), 1):
        (trace / f"{n}.json").write_bytes((codex / f"{name}.json").read_bytes())
    report = tmp_path / "report.html"
    code, out = run(capsys, "replay", "--config", str(config), str(trace), "--out", str(report))
    assert code == 0 and report.exists()
    assert "requests over the window: 0 without (refused by the API), 0 with the proxy" in out
