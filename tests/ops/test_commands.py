"""`compaction-proxy audit`, `plan` and `replay`, run as a user runs them (the CLI's
main, on files), and checked against the proxy's own behaviour where they predict it."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import anthropic
import orjson
import pytest

from proxy.cli import main
from proxy.core.tokens import default_counter
from proxy.ops.audit import audit
from proxy.testing.agent import run_agent
from proxy.testing.standin import StandInOptions
from tests.server.conftest import (  # the fixture, for this module too
    SMALL_WINDOW_POLICY,
    MakeProxy,
    make_compacting_proxy,  # noqa: F401
)
from tests.server.test_metrics import MakeStandIn, long_history

SMALL_WINDOW_TOML = "[[policy]]\n" + "".join(
    f"{k} = {orjson.dumps(v).decode()}\n" for k, v in SMALL_WINDOW_POLICY.items()
)


@pytest.fixture
def small_config(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL_WINDOW_TOML)
    return path


def write_json(path: Path, value: Any) -> Path:
    path.write_bytes(orjson.dumps(value))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def two_tool_request() -> dict[str, Any]:
    return {
        "model": "claude-test-1",
        "system": "You are terse.",
        "tools": [
            {"name": "Read", "input_schema": {"type": "object"}},
            {"name": "Bash", "input_schema": {"type": "object"}},
        ],
        "messages": [
            {"role": "user", "content": "Look around."},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "Read", "input": {"p": "a.py"}},
                    {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"c": "ls"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "x = 1\n" * 3000},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "a.py\n" * 200},
                ],
            },
        ],
    }


def test_audit_lists_every_part_largest_first(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fixtures_dir: Path
) -> None:
    recorded = fixtures_dir / "agent-requests" / "claude-code-turn7.json"
    code, out, _ = run(capsys, "audit", str(recorded))
    assert code == 0
    body = orjson.loads(recorded.read_bytes())["body"]
    parts = audit(body, default_counter())
    assert sum(p.tokens for p in parts) == default_counter().count_request(body)
    rows = out.split("\n")[2 : 2 + len(parts)]
    assert [r.split("  ")[0].strip() for r in rows] == [p.name for p in parts]
    tokens = [int(r.split()[-2].replace(",", "")) for r in rows]
    assert tokens == sorted(tokens, reverse=True)
    assert "tool definitions" in out and "tool results: Bash" in out and "system prompt" in out
    assert "forwarded untouched" in out

    # A bare Messages body; results are told apart by the tool that made them.
    code, out, _ = run(capsys, "audit", str(write_json(tmp_path / "b.json", two_tool_request())))
    assert code == 0
    lines = out.splitlines()
    read = next(n for n, line in enumerate(lines) if line.startswith("tool results: Read"))
    bash = next(n for n, line in enumerate(lines) if line.startswith("tool results: Bash"))
    assert read < bash  # the larger first
    assert any(line.startswith("tool calls: Read") for line in lines)


def test_plan_of_a_request_that_fits(
    capsys: pytest.CaptureFixture[str], fixtures_dir: Path
) -> None:
    code, out, _ = run(
        capsys, "plan", str(fixtures_dir / "agent-requests" / "claude-code-turn1.json")
    )
    assert code == 0
    assert "untouched" in out and "forwarded as the same bytes" in out


async def test_plan_predicts_what_the_proxy_does(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    small_config: Path,
    make_standin: MakeStandIn,
    make_compacting_proxy: MakeProxy,  # noqa: F811
) -> None:
    standin = await make_standin(StandInOptions(windows={"*": 30_000}))
    proxy = await make_compacting_proxy(standin.url)
    client = anthropic.AsyncAnthropic(base_url=proxy.url, api_key="sk-plan", max_retries=0)
    for turns, chars, chat, strategy in [(12, 4_000, 10, "offload"),
                                         (20, 4_000, 200, "offload+summary")]:  # fmt: skip
        body = {"model": "claude-test-1", "max_tokens": 32,
                "messages": long_history(turns, chars, chat)}  # fmt: skip
        file = write_json(tmp_path / f"{strategy}.json", body)
        code, out, _ = run(capsys, "plan", str(file), "--config", str(small_config))
        assert code == 0
        raw = await client.messages.with_raw_response.create(
            **body, extra_headers={"x-conversation-id": uuid.uuid4().hex}
        )
        assert raw.headers["x-compaction-strategy"] == strategy
        assert f"strategy: {strategy}\n" in out
        before = int(raw.headers["x-compaction-tokens-before"])
        assert f"{before:,} -> " in out
        offloaded = [line for line in out.splitlines() if line.startswith("    r_")]
        assert offloaded and all("Bash" in line for line in offloaded)
        if strategy == "offload":  # no summary text to differ: the same numbers exactly
            after = int(raw.headers["x-compaction-tokens-after"])
            assert f"{before:,} -> {after:,} tokens" in out
            assert len(offloaded) == int(raw.headers["x-compaction-offloaded"])
        else:
            # The summariser's cap: summary_tokens (1,500) less a fifth for the identifiers line.
            assert "would summarise 37 messages into at most 1,200 tokens" in out
            assert "if the summariser failed: offload+pack: drop the oldest" in out


def test_plan_and_audit_refuse_what_is_not_a_request(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    not_json = tmp_path / "x.json"
    not_json.write_text("{nope")
    code, _, err = run(capsys, "plan", str(not_json))
    assert code == 2 and "not valid JSON" in err
    code, _, err = run(capsys, "audit", str(write_json(tmp_path / "y.json", {"a": 1})))
    assert code == 2 and "not a Messages request" in err
    code, _, err = run(capsys, "plan", str(tmp_path / "missing.json"))
    assert code == 2 and "missing.json" in err


async def record_trace(make_standin: MakeStandIn, turns: int) -> list[dict[str, Any]]:
    standin = await make_standin(StandInOptions(windows={"*": 10_000_000}, max_recorded=None))
    client = anthropic.AsyncAnthropic(base_url=standin.url, api_key="sk-trace", max_retries=0)
    await run_agent(client, turns=turns, result_chars=8_000)
    return [orjson.loads(r.body) for r in standin.recorded]


async def test_replay_writes_a_report_from_a_jsonl_or_a_directory(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    small_config: Path,
    make_standin: MakeStandIn,
) -> None:
    bodies = await record_trace(make_standin, turns=24)
    jsonl = tmp_path / "trace.jsonl"
    jsonl.write_bytes(b"".join(orjson.dumps(b) + b"\n" for b in bodies))
    folder = tmp_path / "trace"
    folder.mkdir()
    for n, b in enumerate(bodies, 1):  # recorded requests, named so that 10 follows 9
        record = {"method": "POST", "path": "/v1/messages", "headers": {}, "body": b}
        write_json(folder / f"turn{n}.json", record)

    outputs, pages = [], []
    for trace in (jsonl, folder):
        report = tmp_path / f"{trace.stem}.html"
        code, out, err = run(
            capsys, "replay", str(trace), "--config", str(small_config), "--out", str(report)
        )
        assert code == 0
        assert "24/24" in err  # the progress bar reached the end
        page = report.read_text()
        assert page.count("<svg") == 3 and "Context sent per turn" in page
        assert "<polyline" in page and "Billed cost per turn (units)" in page
        assert "cost (units: 1 = an uncached input token)" in page  # every axis says its unit
        outputs.append(out.replace(str(report), ""))
        pages.append(page)
    assert outputs[0] == outputs[1], "the same conversation gives the same report"

    out = outputs[0]
    assert "turns: 24; policy '*': window 30,000" in out
    assert "prices: relative units: uncached input token = 1" in out
    assert re.search(r"crossings: \S+ at turns? \d", out)
    # Without the proxy the conversation outgrows the window: those requests are refused
    # by the API, so they are counted as impossible, never billed as if they had worked.
    over = int(out.split("requests over the window: ")[1].split(" without")[0])
    assert over > 0 and "without (refused by the API), 0 with the proxy" in out
    assert f"; {over} are over the window" in out
    assert pages[0].count("<td>refused (over the window)</td>") == over
    possible = 24 - over
    without = _units(out.split("billed without the proxy: ")[1])
    same_turns = out.split("for all 24 turns; ")[1]
    assert same_turns.split(" (")[1].startswith(f"{_units(same_turns) / without:.2f}x)")
    assert f"for the same {possible} turns" in same_turns
    assert without > 0 and _units(out.split("billed with the proxy:")[1]) > 0


def _units(text: str) -> float:
    """The number before ' units' at the start of text."""
    return float(text.strip().split(" units")[0].replace(",", ""))


async def test_replay_prices_in_a_currency_when_every_model_has_a_price(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, make_standin: MakeStandIn
) -> None:
    bodies = await record_trace(make_standin, turns=6)
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b"".join(orjson.dumps(b) + b"\n" for b in bodies))
    priced = tmp_path / "priced.toml"
    priced.write_text(
        SMALL_WINDOW_TOML + '[[price]]\nmatch = "claude-*"\ncurrency = "EUR"\n'
        "input = 3.0\noutput = 15.0\n"
    )
    report = tmp_path / "r.html"
    code, out, _ = run(capsys, "replay", str(trace), "--config", str(priced), "--out", str(report))
    assert code == 0
    assert "prices: EUR per million tokens from [[price]]: claude-test-1: input 3," in out
    assert " EUR\n" in out.split("billed without the proxy: ")[1].split("billed with")[0]
    page = report.read_text()
    assert "Billed cost per turn (EUR)" in page and "cost (EUR)" in page

    other = tmp_path / "other.toml"
    other.write_text(SMALL_WINDOW_TOML + '[[price]]\nmatch = "gpt-*"\ninput = 1.0\noutput = 4.0\n')
    code, out, _ = run(capsys, "replay", str(trace), "--config", str(other), "--out", str(report))
    assert code == 0  # a model without a price: every cost in the same relative units
    assert "prices: relative units" in out and "(no [[price]] for claude-test-1)" in out


def test_replay_of_nothing_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run(capsys, "replay", str(empty), "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no requests" in err
    code, _, err = run(capsys, "replay", str(tmp_path / "none"), "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no such file" in err
