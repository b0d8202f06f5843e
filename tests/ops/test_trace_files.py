"""Traces as people keep them: gzip-compressed, handed to the wrong command, or read with
a forced `--format` that does not fit. Run as a user runs the CLI (its main, on files)."""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest

from proxy.cli import main
from tests.ops.test_ops_formats import CONFIG
from tests.ops.test_read_result_deferred import TOOL_SEARCH_BETAS, session
from tests.ops.test_simulate import anthropic_request, chat_request


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(CONFIG)
    return path


def jsonl(requests: list[dict[str, object]]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in requests)


def test_plan_and_replay_read_gzip_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: Path
) -> None:
    requests = [chat_request(turns=t) for t in range(10, 30)]
    plain, packed = tmp_path / "trace.jsonl", tmp_path / "trace.jsonl.gz"
    plain.write_bytes(jsonl(requests))
    packed.write_bytes(gzip.compress(jsonl(requests)))
    outputs = []
    for trace in (plain, packed):
        report = tmp_path / f"{trace.name}.html"
        code, out, err = run(
            capsys, "replay", str(trace), "--config", str(config), "--out", str(report)
        )
        assert code == 0 and "20/20" in err and report.exists()
        outputs.append(out.replace(str(report), ""))
    assert outputs[0] == outputs[1]

    one = tmp_path / "request.json.gz"
    one.write_bytes(gzip.compress(orjson.dumps(requests[-1])))
    code, out, _ = run(capsys, "plan", str(one), "--config", str(config))
    assert code == 0 and "strategy: offload" in out

    folder = tmp_path / "turns"
    folder.mkdir()
    for n, r in enumerate(requests, 1):
        (folder / f"turn{n}.json.gz").write_bytes(gzip.compress(orjson.dumps(r)))
    code, out, _ = run(
        capsys, "replay", str(folder), "--config", str(config), "--out", str(tmp_path / "d.html")
    )
    assert code == 0 and out.replace(str(tmp_path / "d.html"), "") == outputs[0]


def test_broken_gzip_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = tmp_path / "trace.jsonl.gz"
    fake.write_bytes(jsonl([chat_request(turns=3)]))  # named .gz, not compressed
    truncated = tmp_path / "cut.jsonl.gz"
    truncated.write_bytes(gzip.compress(jsonl([chat_request(turns=3)] * 5))[:-40])
    for trace in (fake, truncated):
        code, _, err = run(capsys, "replay", str(trace), "--out", str(tmp_path / "r.html"))
        assert code == 2 and err.count("\n") == 1 and str(trace) in err
    code, _, err = run(capsys, "plan", str(fake))
    assert code == 2 and err == f"compaction-proxy: {fake}: named .gz but not gzip-compressed\n"


def test_plan_given_a_trace_points_to_replay(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(jsonl([anthropic_request("Fix it", turns=t) for t in (1, 2, 3)]))
    packed = tmp_path / "trace.jsonl.gz"
    packed.write_bytes(gzip.compress(trace.read_bytes()))
    for file in (trace, packed):
        code, _, err = run(capsys, "plan", str(file))
        assert code == 2
        assert err == (
            f"compaction-proxy: {file}: a trace of 3 requests, one per line; this command"
            f" takes one request: `compaction-proxy replay {file}` runs a whole conversation\n"
        )
    code, _, err = run(capsys, "plan", str(tmp_path))
    assert code == 2 and f"`compaction-proxy replay {tmp_path}`" in err


def test_a_forced_format_that_does_not_fit_warns(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, config: Path
) -> None:
    chat = tmp_path / "chat.json"
    chat.write_bytes(orjson.dumps(chat_request(turns=12)))
    code, out, err = run(
        capsys, "plan", str(chat), "--config", str(config), "--format", "anthropic"
    )
    assert code == 0 and "format: anthropic (Messages)" in out
    assert err == (
        "compaction-proxy: warning: --format anthropic, but the request looks like OpenAI Chat"
        ' Completions (a {"type": "function"} tool); read as anthropic anyway (--format auto'
        " tells them apart)\n"
    )
    messages = tmp_path / "messages.json"
    messages.write_bytes(orjson.dumps(anthropic_request("Fix it", turns=4)))
    code, _, err = run(capsys, "plan", str(messages), "--format", "chat")
    assert code == 0 and "looks like Anthropic Messages (a tool with input_schema)" in err
    for fitting in (("--format", "anthropic"), ("--format", "auto"), ()):
        code, _, err = run(capsys, "plan", str(messages), *fitting)
        assert code == 0 and err == ""

    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(jsonl([chat_request(turns=t) for t in (10, 11)]))
    code, _, err = run(
        capsys, "replay", str(trace), "--format", "anthropic", "--out", str(tmp_path / "r.html")
    )
    assert code == 0
    assert "compaction-proxy: warning: first request: --format anthropic, but" in err


def test_replay_reads_the_betas_a_trace_recorded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A trace of recorded requests (`{method, path, headers, body}`) is replayed under
    their `anthropic-beta`: with tool search's, read_result joins deferred (cheaper here,
    tests/ops/test_read_result_deferred.py); the bare bodies replay without it."""
    config = tmp_path / "policy.toml"
    config.write_text(
        '[[policy]]\nmatch = "claude-test-1"\nwindow = 1000000\noffload_trigger = 8000\n'
    )
    bodies = session(8)
    for body in bodies:  # no tool deferred: only the betas can say tool search is on
        body["tools"] = [t for t in body["tools"] if not t.get("defer_loading")]
    headers = {"anthropic-beta": TOOL_SEARCH_BETAS, "x-api-key": "sk-ant-recorded"}
    recorded = [
        {"method": "POST", "path": "/v1/messages", "headers": headers, "body": b} for b in bodies
    ]
    costs = []
    for name, lines in (("bare.jsonl", bodies), ("recorded.jsonl", recorded)):
        trace, report = tmp_path / name, tmp_path / f"{name}.html"
        trace.write_bytes(jsonl(lines))
        code, out, _ = run(
            capsys, "replay", str(trace), "--config", str(config), "--out", str(report)
        )
        assert code == 0
        line = next(t for t in out.splitlines() if t.startswith("billed with the proxy"))
        costs.append(int(line.split(":")[1].split("units")[0].replace(",", "")))
    assert costs[1] < costs[0]
