"""The rule that picks the upstream for a path (proxy/server/routing.py)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from proxy.server.routing import upstream_for

OPENAI_CLIENT = CIMultiDict({"Authorization": "Bearer sk-x"})
ANTHROPIC_BEARER = CIMultiDict({"Authorization": "Bearer t", "anthropic-version": "2023-06-01"})
ANTHROPIC_KEY = CIMultiDict({"x-api-key": "k", "anthropic-version": "2023-06-01"})
NOBODY: CIMultiDict[str] = CIMultiDict()


@pytest.mark.parametrize(
    ("path", "headers", "target"),
    [
        ("/v1/messages", OPENAI_CLIENT, "anthropic"),
        ("/v1/messages/count_tokens", OPENAI_CLIENT, "anthropic"),
        ("/v1/messages/batches/abc", ANTHROPIC_KEY, "anthropic"),
        ("/v1/chat/completions", ANTHROPIC_KEY, "openai"),
        ("/v1/completions", NOBODY, "openai"),
        ("/v1/completions2", NOBODY, "anthropic"),  # a prefix is a whole path segment
        ("/v1/embeddings", OPENAI_CLIENT, "openai"),
        ("/v1/responses/resp_1/input_items", OPENAI_CLIENT, "openai"),
        ("/v1/models", OPENAI_CLIENT, "openai"),
        ("/v1/models", ANTHROPIC_BEARER, "anthropic"),  # Claude Code with an auth token
        ("/v1/models", ANTHROPIC_KEY, "anthropic"),
        ("/v1/files", NOBODY, "anthropic"),
        ("/healthz-of-upstream", OPENAI_CLIENT, "openai"),
    ],
)
def test_upstream_for(path: str, headers: CIMultiDict[str], target: str) -> None:
    assert upstream_for(path, headers) == target
