"""`compaction-proxy demo`, run as a new user runs it: a subprocess, no API key, no extras
installed. It must finish, show the proxy compacting, write the report, leave nothing
running."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.core.offload import ref_for
from proxy.ops.demo import facts_kept
from proxy.wire import ANTHROPIC
from tests.server.cli_process import cli_env, run_cli
from tests.server.test_startup import processes_mentioning

TURN = re.compile(
    r"^turn +(\d+)/(\d+)  (\S+) +(?:history +([\d,]+) -> +([\d,]+) tokens|\(under the trigger\))"
    r"  prompt +[\d,]+ tokens, +(\d+)% read from cache$"
)


@pytest.mark.parametrize("api", ["messages", "chat"])
def test_the_demo_shows_compaction_and_writes_the_report(tmp_path: Path, api: str) -> None:
    report = tmp_path / "demo-report.html"
    env = cli_env(tmp_path, TMPDIR=str(tmp_path))  # its state directory under tmp_path
    done = run_cli(
        ["demo", "--turns", "24", "--api", api, "--out", str(report)], env, hide_extras=True
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()

    turns = [m for m in map(TURN.match, out) if m]
    assert [int(m[1]) for m in turns] == list(range(1, 25))
    strategies = [m[3] for m in turns]
    assert strategies[0] == "untouched"
    rewritten = [m for m in turns if m[4]]
    assert rewritten and rewritten[0][3].startswith("offload")  # compaction shows
    for m in rewritten:
        assert int(m[5].replace(",", "")) < int(m[4].replace(",", ""))  # after < before
    # After the first rewrite the prefix it froze is read from the cache again.
    shares = [int(m[6]) for m in turns[turns.index(rewritten[0]) + 1 :]]
    assert shares and max(shares) >= 50

    by_strategy = next(x for x in out if x.startswith("turns by strategy: ")).split(": ", 1)[1]
    counts = dict(re.findall(r"(?:^|, )([a-z+]+) (\d+)", by_strategy))
    assert {s: int(n) for s, n in counts.items()} == {s: strategies.count(s) for s in counts}
    assert "requests over the window: " in done.stdout and "0 with the proxy" in done.stdout
    # The facts of the conversation the last request upstream kept (issue 35).
    kept = re.search(r"the proxy sent: (\d+) of (\d+).*identifiers.*: (\d+) of (\d+)", done.stdout)
    assert kept, done.stdout
    assert 0 < int(kept[1]) <= int(kept[2]) and 0 < int(kept[3]) < int(kept[4])
    assert out[-1] == f"report: {report}"
    page = report.read_text()
    assert page.count("<svg") == 3 and f"Replay of the demo ({api})" in page
    assert "24/24" in done.stderr  # the progress bar
    assert not processes_mentioning(str(tmp_path)), "the embedded Redis was stopped"


def test_a_demo_of_no_turns_is_a_mistake(tmp_path: Path) -> None:
    done = run_cli(["demo", "--turns", "0"], cli_env(tmp_path))
    assert done.returncode == 2
    assert done.stderr == "compaction-proxy: demo --turns must be 1 or more, got 0\n"


def test_facts_kept_counts_the_messages_and_the_refs_the_last_request_names() -> None:
    result = "build ok\nthe exporter listens on port 9187\nconfig in deploy/helm/values-eu.yaml"
    client = [
        {"role": "user", "content": "Fix computeShardKey in src/shard_key.py"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": result}],
        },
    ]
    stub = f"[offloaded: read_result(ref={ref_for(result)!r})]"
    sent = [
        client[0],
        client[1],
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": stub}],
        },
    ]
    found = facts_kept(client, sent, ANTHROPIC)
    assert {"computeShardKey", "src/shard_key.py", "port 9187"} <= set(found.facts)
    assert {"computeShardKey", "src/shard_key.py"} <= set(found.kept)
    assert {"port 9187", "deploy/helm/values-eu.yaml"} <= set(found.readable)
    assert "toolu_1" not in found.facts  # a protocol id is not a fact
    # Without the ref, what only the result held is lost.
    lost = facts_kept(client, sent[:2], ANTHROPIC)
    assert "port 9187" not in lost.kept and not lost.readable
    assert "not kept: " in lost.line() and "port 9187" in lost.line()
