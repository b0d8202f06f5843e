"""ClientJSON.encode: what a rewrite keeps goes out as the client's bytes."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.exact_json import ClientJSON

BIG = b"123456789012345678901234567890"


def test_a_kept_message_holding_an_integer_beyond_64_bits_keeps_its_digits() -> None:
    old = (
        b'{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"run","input":{"build_id":'
        + BIG
        + b"}}]}"
    )
    new = b'{"role":"user","content":"go on"}'
    raw = b'{"model":"m","messages":[' + old + b"," + new + b"]}"
    parsed = orjson.loads(raw)
    assert orjson.dumps(parsed) != raw  # orjson read the integer as a float
    source = ClientJSON(raw, parsed)
    note = {"role": "user", "content": "[earlier history was dropped]"}
    out = source.encode({**parsed, "messages": [note, *parsed["messages"]]})
    assert (
        out == b'{"model":"m","messages":[' + orjson.dumps(note) + b"," + old + b"," + new + b"]}"
    )


def test_a_message_rebuilt_from_a_kept_one_keeps_the_blocks_it_did_not_change() -> None:
    use = b'{"type":"tool_use","id":"t1","name":"run","input":{"n":' + BIG + b"}}"
    said = b'{"type":"text","text":"caf\\u00e9"}'
    raw = b'{"messages": [ {"role": "assistant", "content": [' + said + b", " + use + b"]} ]}"
    parsed = orjson.loads(raw)
    message = parsed["messages"][0]
    content = message["content"]
    marked = {**content[-1], "cache_control": {"type": "ephemeral"}}
    rebuilt = {**message, "content": [content[0], marked]}
    out = ClientJSON(raw, parsed).encode({**parsed, "messages": [rebuilt]})
    assert out == (
        b'{"messages":[{"role":"assistant","content":['
        + said
        + b',{"type":"tool_use","id":"t1","name":"run","input":{"n":'
        + BIG
        + b'},"cache_control":{"type":"ephemeral"}}]}]}'
    )


def test_compact_json_is_serialised_once_and_the_same() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"n":1.5}'
    parsed = orjson.loads(raw)
    source = ClientJSON(raw, parsed)
    assert source.canonical and source.encodable
    assert source.encode(parsed) == raw


def test_a_duplicated_key_is_passed_on_as_sent_in_a_kept_message() -> None:
    kept = b'{"role":"user","content":"a","content":"b"}'
    raw = b'{"messages":[' + kept + b',{"role":"user","content":"c"}]}'
    parsed = orjson.loads(raw)
    out = ClientJSON(raw, parsed).encode({**parsed, "messages": parsed["messages"][:1]})
    assert out == b'{"messages":[' + kept + b"]}"


def test_a_body_nested_beyond_orjsons_writing_limit_is_still_spliced() -> None:
    deep = b"[" * 400 + b"]" * 400
    kept = b'{"role":"user","content":[{"type":"x","v":' + deep + b"}]}"
    raw = b'{"messages":[{"role":"user","content":"old"},' + kept + b"]}"
    parsed = orjson.loads(raw)
    source = ClientJSON(raw, parsed)
    assert not source.canonical and not source.encodable
    out = source.encode({**parsed, "messages": parsed["messages"][1:]})
    assert out == b'{"messages":[' + kept + b"]}"


# -- a property: any client's spelling of any JSON, any rewrite of its list ----------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def spelled(draw: st.DrawFn, value: Any) -> bytes:
    """`value` as some client might write it: spaces, escapes, exponents, big integers."""
    space = draw(st.sampled_from([b"", b" ", b"\n  "]))
    if isinstance(value, dict):
        parts = [
            spelled_string(draw, key) + space + b":" + space + draw(spelled(v))
            for key, v in value.items()
        ]
        return b"{" + space + (b"," + space).join(parts) + space + b"}"
    if isinstance(value, list):
        return b"[" + (b"," + space).join(draw(spelled(v)) for v in value) + b"]"
    if isinstance(value, str):
        return spelled_string(draw, value)
    if isinstance(value, float) and draw(st.booleans()):
        return repr(value).replace("e+", "E").encode()
    return json.dumps(value).encode()


def spelled_string(draw: st.DrawFn, text: str) -> bytes:
    return json.dumps(text, ensure_ascii=draw(st.booleans())).encode()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_every_kept_element_goes_out_as_written(data: st.DataObject) -> None:
    elements = data.draw(st.lists(st.dictionaries(st.text(max_size=4), VALUES, max_size=3)))
    other = data.draw(VALUES)
    texts = [data.draw(spelled(e)) for e in elements]
    other_text = data.draw(spelled(other))
    raw = b'{"other": ' + other_text + b', "messages": [' + b", ".join(texts) + b"]}"
    parsed = orjson.loads(raw)
    kept = data.draw(st.lists(st.integers(0, max(0, len(texts) - 1)), unique=True))
    kept = sorted(k for k in kept if k < len(texts))
    made = {"role": "user", "content": data.draw(st.text(max_size=5))}
    messages = [made, *(parsed["messages"][k] for k in kept)]
    out = ClientJSON(raw, parsed).encode({**parsed, "messages": messages})
    listed = b",".join([orjson.dumps(made), *(texts[k] for k in kept)])
    assert out == b'{"other":' + other_text + b',"messages":[' + listed + b"]}"


# What orjson writes (its integers are 64-bit).
WRITABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=4)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_a_lines_rewrites_written_in_kept_parts_are_orjsons_writing(data: st.DataObject) -> None:
    """`encode_kept` over a line's rewrites, each holding some of the containers the one
    before held (the same objects) and new ones: always orjson's bytes of the rewrite."""
    pool = data.draw(st.lists(st.dictionaries(st.text(max_size=3), WRITABLE, max_size=3)))
    tools = data.draw(st.lists(st.dictionaries(st.text(max_size=3), WRITABLE, max_size=2)))
    kept: dict[int, tuple[object, bytes]] = {}
    for _ in range(data.draw(st.integers(1, 5))):
        body = {"model": "m", "messages": pool, "tools": tools, "other": data.draw(WRITABLE)}
        source = ClientJSON(orjson.dumps(body), body, True, kept)
        picked = data.draw(st.lists(st.sampled_from(pool), max_size=6)) if pool else []
        made = data.draw(st.lists(st.dictionaries(st.text(max_size=3), WRITABLE, max_size=2)))
        rewrite = {**body, "messages": [*picked, *made], "tools": [*tools, {"name": "r"}]}
        assert source.encode_kept(rewrite) == orjson.dumps(rewrite)
        pool = [*pool, *made]
