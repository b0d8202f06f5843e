"""`compaction-proxy demo`, run as a new user runs it: a subprocess, no API key, no extras
installed. It must finish, show the proxy compacting, write the report, leave nothing
running."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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
    assert out[-1] == f"report: {report}"
    page = report.read_text()
    assert page.count("<svg") == 3 and f"Replay of the demo ({api})" in page
    assert "24/24" in done.stderr  # the progress bar
    assert not processes_mentioning(str(tmp_path)), "the embedded Redis was stopped"


def test_a_demo_of_no_turns_is_a_mistake(tmp_path: Path) -> None:
    done = run_cli(["demo", "--turns", "0"], cli_env(tmp_path))
    assert done.returncode == 2
    assert done.stderr == "compaction-proxy: demo --turns must be 1 or more, got 0\n"
