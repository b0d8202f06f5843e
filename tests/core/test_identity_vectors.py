"""Conversation ids are store keys: a conversation's lines, checkpoints and summaries
sit under them, on every replica and across releases. These vectors pin them, for each
wire format's identity view and each source of the id but the headers (which are read
the same way for every format): a change of how a view is made or hashed would strand
every stored conversation at the next release."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.core.identity import conversation_of
from proxy.wire import ANTHROPIC, CHAT, RESPONSES

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"
WIRES = {"messages": ANTHROPIC, "chat": CHAT, "responses": RESPONSES}
SESSION = json.dumps({"session_id": "s-42", "device": "d"})

# (format, body or "fixture:<name>", the id computed before identity views were typed)
VECTORS: list[tuple[str, Any, str]] = [
    ("messages", "fixture:claude-code-turn1.json", "ca3560453b039caaf290a2881"),
    ("messages", "fixture:claude-code-turn7.json", "ca3560453b039caaf290a2881"),
    ("responses", "fixture:codex-turn1.json", "c522106d3034b39ac8d681a95"),
    ("responses", "fixture:codex-turn6.json", "c522106d3034b39ac8d681a95"),
    ("responses", "fixture:codex-after-compaction.json", "c522106d3034b39ac8d681a95"),
    ("messages", {"messages": [{"role": "user", "content": "hi"}]}, "c574654273be507ad8eaf88be"),
    (
        "messages",
        {
            "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        },
        "cec75724663f3dac0eba47850",
    ),
    (
        "messages",
        {
            "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
            "messages": [],
        },
        "ca371dcac2feadcab988c204e",
    ),
    (
        "messages",
        {"messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": SESSION}},
        "c3d77f75b4c23f8e24083d506",
    ),
    (
        "messages",
        {"messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": "plain"}},
        "c574654273be507ad8eaf88be",
    ),
    (
        "chat",
        {
            "messages": [
                {"role": "system", "content": "s"},
                {"role": "developer", "content": "d"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "yo"},
            ]
        },
        "cb7bc18a55e2254fb459606f9",
    ),
    (
        "chat",
        {"messages": [{"role": "user", "content": "hi"}], "metadata": {"user_id": SESSION}},
        "c3d77f75b4c23f8e24083d506",
    ),
    ("chat", {"messages": [{"role": "system", "content": "only"}]}, "cc237369f9aafa10fb5f1eb96"),
    ("chat", {"messages": []}, "cd328873b5ba9aca116969b01"),
    ("responses", {"input": "just text", "instructions": "be brief"}, "c44bc49afdd1efb80151cea7e"),
    (
        "responses",
        {
            "input": [
                {"type": "message", "role": "developer", "content": "d"},
                {"type": "message", "role": "user", "content": "hi"},
            ],
            "prompt_cache_key": "thread-7",
        },
        "c7d9116d95ea4b861306c0cb9",
    ),
    (
        "responses",
        {"input": [{"type": "message", "role": "user", "content": "hi"}], "prompt_cache_key": ""},
        "cc5d01c8961cdbd3cd40e8320",
    ),
]


def body_of(case: Any) -> Any:
    if isinstance(case, str):
        recorded = orjson.loads((AGENT / case.split(":", 1)[1]).read_bytes())
        return recorded.get("body", recorded)
    return case


@pytest.mark.parametrize(("fmt", "case", "expected"), VECTORS)
def test_conversation_ids_never_change(fmt: str, case: Any, expected: str) -> None:
    assert conversation_of({}, WIRES[fmt].identity_view(body_of(case)), "t1") == expected
