"""The canonical request target (proxy/core/target.py): table tests."""

from __future__ import annotations

import orjson
import pytest

from proxy.core.duplicate_keys import duplicate_field
from proxy.core.target import target_problem

CANONICAL = [
    "/v1/messages",
    "/v1/messages?beta=true",
    "/v1/models?after_id=a%2Fb&x=..",  # the query is not the path
    "/v1/files/file-abc_1.txt",
    "/v1/files/a%20b",  # an encoded reserved or other character stays encoded
    "/v1/models/",
    "/healthz",
    "/",
]
NOT_CANONICAL = [
    "/dashboard%2F..%2Fv1%2Fmessages",
    "/dashboard%2f..%2fv1%2fmodels",
    "/dashboard/..%2Fv1/messages",
    "/dashboard/../v1/messages",
    "/v1/./messages",
    "/v1/messages/..",
    "/v1/messages/.",
    "/v1//messages",
    "//v1/messages",
    "/v1/%6Dessages",
    "/v1/messages%2E",
    "/v1%5Cmessages",
    "/v1\\messages",
    "/v1/files/%252F",
    "/v1/files/%",
    "/v1/files/%zz",
    "/v1/files/%00",
    "/v1/files/a b",
    "/v1/files/é",
    "/v1/messages#x",
    "http://elsewhere.example/v1/messages",
    "*",
    "",
]


@pytest.mark.parametrize("target", CANONICAL)
def test_canonical_targets_pass(target: str) -> None:
    assert target_problem(target) is None


@pytest.mark.parametrize("target", NOT_CANONICAL)
def test_other_targets_are_refused(target: str) -> None:
    assert target_problem(target) is not None


DUPLICATES = [
    (b'{"max_tokens": 50000, "model": "m", "max_tokens": 10}', "max_tokens"),
    (b'{"max_tok\\u0065ns": 50000, "max_tokens": 10}', "max_tokens"),
    (b'{"input": [1, 2], "input": [1]}', "input"),
    (b'{"requests": [{"params": {"n": 1, "n": 9}}]}', "n"),
    (b'{"model": "m", "max_tokens": 1, "tools": [{"s": {"model": {}, "max_tokens": {}}}]}', None),
    (b'{"messages": [{"content": "say \\"max_tokens\\": 5, \\u2019"}], "max_tokens": 1}', None),
    (b'{"model": "m", "other": 1, "other": 2}', None),  # not a field the proxy reads
    (b'{"generationConfig": {"maxOutputTokens": 9, "maxOutputTokens": 1}}', "maxOutputTokens"),
    (b'{"generation_config": {"candidate_count": 1, "candidate_count": 8}}', "candidate_count"),
    (b'{"contents": [], "contents": [{"role": "user"}]}', "contents"),
]


@pytest.mark.parametrize(("body", "found"), DUPLICATES)
def test_duplicate_fields(body: bytes, found: str | None) -> None:
    assert duplicate_field(body, orjson.loads(body)) == found
