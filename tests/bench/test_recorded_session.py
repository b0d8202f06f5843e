"""The recorded Claude Code session (bench/sessions/) and its fresh conversations: what
bench/crossing_cpu.py replays by default."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from fresh_session import FreshSessions  # noqa: E402
from session_file import Recorded, read_meta, read_session, write_session  # noqa: E402


def test_session_file_round_trip(tmp_path: Path) -> None:
    bodies = [b'{"messages":[1]}', b'{"messages":[1,2],"x":3}', b"", b'{"messages":[1,2,4],"x":3}']
    requests = [Recorded("POST", "/v1/messages", {"a": "b"}, "tool", body) for body in bodies]
    path = tmp_path / "s.zst"
    write_session(path, {"model": "m"}, requests)
    assert read_session(path) == requests
    assert read_meta(path) == {"format": read_meta(path)["format"], "model": "m", "requests": 4}


def test_the_recorded_session_is_a_long_real_one() -> None:
    sessions = FreshSessions()
    assert len(sessions) >= 40
    last = orjson.loads(sessions.recorded[-1].body)
    assert last["model"] == "claude-opus-5-5"
    results = [
        len(b["content"])
        for m in last["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_result"
    ]
    assert len(results) >= 40
    # Each turn's result (or a parallel pair's) is 15-30 KB.
    assert sum(15_000 <= n <= 30_000 for n in results) >= 36
    assert all(n >= 9_000 for n in results)


def test_fresh_conversations_keep_the_structure_and_change_the_content() -> None:
    sessions = FreshSessions()
    one = list(sessions.conversation("one", 6))
    two = list(sessions.conversation("two", 6))
    recorded = sessions.recorded[:6]
    for a, b, r in zip(one, two, recorded, strict=True):
        assert len(a.body) == len(b.body) == len(r.body)
        assert a.body != b.body != r.body
    # A result repeats byte for byte in every later request of its conversation.
    first = orjson.loads(one[2].body)["messages"]
    later = orjson.loads(one[5].body)["messages"]
    assert first[3] == later[3]
    assert later[3] != orjson.loads(two[5].body)["messages"][3]


def test_the_sessions_recorded_with_tool_search_on() -> None:
    """`bench/record_session.py --tool-search`: Claude Code with ENABLE_TOOL_SEARCH=true
    sends the tool-search beta with every request and, its rarely used tools unsent until
    a ToolSearch call loads one, defers none in `tools` (issue 35, bench/RESULTS.md)."""
    for name in ("claude-code-opus-5-5-tool-search", "claude-code-logs-heldout-tool-search"):
        path = ROOT / "bench" / "sessions" / f"{name}.zst"
        assert read_meta(path)["tool_search"] is True
        main = [r for r in read_session(path) if r.kind in ("tool", "text")]
        assert len(main) == 43
        for r in main:
            assert "advanced-tool-use-2025-11-20" in r.headers["anthropic-beta"]
            tools = orjson.loads(r.body)["tools"]
            assert "ToolSearch" in {t["name"] for t in tools}
            assert not any(t.get("defer_loading") for t in tools)
