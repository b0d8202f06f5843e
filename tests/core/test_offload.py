"""Stubs, refs and read_result slices."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.core.offload import (
    MAX_READ_CHARS,
    ReadRequest,
    parse_read_args,
    read_result_schema,
    read_slice,
    ref_for,
    result_text,
    stub_text,
    unknown_ref,
)
from proxy.wire.anthropic import choose_tool_name


def test_tool_name_respects_the_clients_own_tools() -> None:
    assert choose_tool_name(None) == "read_result"
    assert choose_tool_name([{"name": "Bash"}]) == "read_result"
    assert choose_tool_name([{"name": "read_result"}]) == "compaction_proxy_read_result"
    taken = [{"name": "read_result"}, {"name": "compaction_proxy_read_result"}]
    assert choose_tool_name(taken) is None


def test_the_tool_definition_is_the_same_bytes_every_time() -> None:
    assert read_result_schema() == read_result_schema()
    schema = read_result_schema()
    assert (
        schema["required"] == ["ref"]
        and schema["properties"]["length"]["maximum"] == MAX_READ_CHARS
    )


def test_result_text_only_for_text() -> None:
    assert result_text({"content": "abc"}) == "abc"
    assert (
        result_text({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]})
        == "a\nb"
    )
    assert result_text({"content": [{"type": "image", "source": {}}]}) is None
    assert result_text({"content": []}) is None and result_text({}) is None


def test_stub_names_length_ref_and_how_to_read_on() -> None:
    text = "line\n" * 1000
    ref = ref_for(text)
    stub = stub_text(text, ref, "read_result", 100, 4000)
    head, _, tail = stub.rpartition("\n[compaction-proxy offloaded this result:")
    assert text.startswith(head) and len(head) <= 100 and head.endswith("line")
    assert "5,000 characters" in tail
    assert f'read_result(ref="{ref}", start={len(head)}, length=4000)' in tail


@given(st.text(min_size=1))
def test_refs_are_content_hashes(text: str) -> None:
    assert ref_for(text) == ref_for(str(text)) and ref_for(text).startswith("r_")
    assert len(ref_for(text)) == 18


def test_read_args_are_checked() -> None:
    assert parse_read_args({"ref": "r_1"}, 500) == ReadRequest("r_1", 0, 500)
    assert parse_read_args({"ref": "r_1", "start": 5, "length": 10**9}, 500) == ReadRequest(
        "r_1", 5, MAX_READ_CHARS
    )
    for bad in (
        {},
        {"ref": 3},
        {"ref": "r", "start": -1},
        {"ref": "r", "length": 0},
        {"ref": "r", "start": True},
        "r_1",
    ):
        assert isinstance(parse_read_args(bad, 500), str)


def test_slices_say_where_they_are() -> None:
    text = "".join(str(i % 10) for i in range(2500))
    first = read_slice(text, ReadRequest("r", 0, 1000))
    assert first.startswith("[characters 0 to 1,000 of 2,500. Call again with start=1000")
    assert first.endswith(text[:1000])
    last = read_slice(text, ReadRequest("r", 2000, 1000))
    assert "That is the end." in last and last.endswith(text[2000:])
    assert "past the end" in read_slice(text, ReadRequest("r", 2500, 10))
    assert unknown_ref("r_x") == unknown_ref("r_x") and "r_x" in unknown_ref("r_x")
