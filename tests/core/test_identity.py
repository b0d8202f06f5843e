"""Tenant and conversation ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.calibration import sample_ratio
from proxy.core.identity import conversation_of as conversation_in_view
from proxy.core.identity import credential, tenant_of
from proxy.wire import ANTHROPIC

AGENT = Path(__file__).parents[1] / "fixtures" / "agent-requests"


def conversation_of(headers: dict[str, str], body: dict[str, Any], tenant: str) -> str:
    """The id of a Messages request's conversation."""
    return conversation_in_view(headers, ANTHROPIC.identity_view(body), tenant)


def test_tenant_hashes_the_credential_and_never_holds_it() -> None:
    a = tenant_of({"x-api-key": "sk-ant-secret-1"})
    assert a == tenant_of({"authorization": "Bearer sk-ant-secret-1"})
    assert a != tenant_of({"x-api-key": "sk-ant-secret-2"})
    assert "secret" not in a and a.startswith("t") and len(a) == 21
    assert credential({"authorization": "Bearer  tok "}) == "tok"


def test_a_sigv4_clients_tenant_is_its_access_key_not_the_signature() -> None:
    def signed(key: str, signature: str) -> dict[str, str]:
        scope = f"Credential={key}/20261205/us-east-1/bedrock/aws4_request"
        header = f"AWS4-HMAC-SHA256 {scope}, SignedHeaders=host;x-amz-date, Signature={signature}"
        return {"authorization": header}

    first, second = signed("AKIAONE", "a" * 64), signed("AKIAONE", "b" * 64)
    assert tenant_of(first) == tenant_of(second) != tenant_of(signed("AKIATWO", "a" * 64))
    assert credential(first) == "aws:AKIAONE"


def test_conversation_id_sources_in_order() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    by_header = conversation_of({"x-conversation-id": "abc"}, body, "t1")
    assert by_header == conversation_of(
        {"x-conversation-id": "abc", "x-claude-code-session-id": "zzz"}, body, "t1"
    )
    assert by_header != conversation_of({"x-claude-code-session-id": "abc"}, body, "t1")
    hashed = conversation_of({}, body, "t1")
    grown = {"messages": [*body["messages"], {"role": "assistant", "content": "yo"}]}
    assert conversation_of({}, grown, "t1") == hashed, "stable as the conversation grows"
    assert conversation_of({}, body, "t2") != hashed


def test_claude_code_session_inside_metadata() -> None:
    recorded = json.loads((AGENT / "claude-code-turn7.json").read_text())
    body = recorded["body"]
    from_body = conversation_of({}, body, "t1")
    meta = json.loads(body["metadata"]["user_id"])
    assert from_body == conversation_of({}, {"metadata": {"user_id": json.dumps(meta)}}, "t1")
    headers = {k.lower(): v for k, v in recorded["headers"].items()}
    assert conversation_of(headers, body, "t1") != from_body  # the header comes first


@given(st.text(), st.text())
def test_ids_are_key_safe(header: str, session: str) -> None:
    body = {"metadata": {"user_id": json.dumps({"session_id": session})}}
    for cid in (
        conversation_of({"x-conversation-id": header}, body, "t"),
        conversation_of({}, body, "t"),
    ):
        assert cid.isalnum() and len(cid) == 25


def test_sample_ratio_clamps_and_ignores_junk() -> None:
    assert sample_ratio(100, 130) == 1.3
    assert sample_ratio(100, 10_000) == 3.0
    assert sample_ratio(0, 10) is None and sample_ratio(10, 0) is None
