"""The rewrite planner on Responses histories (units of items): the same guarantees.

Every rewrite must be a request the strict stand-in accepts (a call and its output kept
or dropped together, the reasoning item before a call with it, reasoning and compaction
content unchanged), fit the window, keep what is pinned, and be the same bytes twice.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.checkpoint import Checkpoint
from proxy.core.commands import LoadConversation, SaveCrossing
from proxy.core.counting import count_request
from proxy.core.digests import message_digest
from proxy.core.driver import CompactionRequest, commands_of, compaction
from proxy.core.exact_json import ClientJSON
from proxy.core.outcome import FoldPlan, Refuse, Rewrite, Untouched
from proxy.core.planner import plan
from proxy.core.rewrites import fold
from proxy.core.tokens import TokenCounter
from proxy.core.working import PlanInput
from proxy.testing.api_responses import ResponsesOptions
from proxy.testing.responses_items import check_seals, seal
from proxy.wire.responses import RESPONSES, ResponsesCounter, read_result_tool
from proxy.wire.responses_units import flatten, units_of
from proxy.wire.responses_validation import validate_responses_request
from tests.core.test_driver import Store
from tests.core.test_planner_chat import policy, words

COUNTER = ResponsesCounter(TokenCounter())
TOOL_TOKENS = COUNTER.count_tools([read_result_tool("read_result")])
FIXED = 500
KEY = ResponsesOptions().seal_key
TOOLS = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch"},
]


def message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def reasoning(k: int) -> dict[str, Any]:
    sealed = seal({"kind": "reasoning", "text": f"thinking about step {k}"}, KEY)
    return {"id": f"rs_{k:032x}", "type": "reasoning", "summary": [], "encrypted_content": sealed}


def said(k: int, text: str) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {"id": f"msg_{k:032x}", "type": "message", "role": "assistant", "content": [part]}


def function_call(k: int, n: int = 0) -> dict[str, Any]:
    return {
        "id": f"fc{n}_{k:032x}",
        "type": "function_call",
        "name": "exec_command",
        "arguments": orjson.dumps({"cmd": f"make step-{k}-{n}"}).decode(),
        "call_id": f"call_{k}_{n}",
    }


def output(k: int, n: int, size: int, parts: bool = False) -> dict[str, Any]:
    text: Any = words(size, f"o{k}_{n}_")
    if parts:
        text = [{"type": "input_text", "text": text}]
    return {"type": "function_call_output", "call_id": f"call_{k}_{n}", "output": text}


def start() -> list[dict[str, Any]]:
    return [
        message("developer", "You are a coding agent. " + words(40, "rule")),
        message("user", "<environment_context>\n  <cwd>/repo</cwd>\n</environment_context>"),
        message("user", "Fix the failing test in src/app.py"),
    ]


def conversation(turns: int, size: int = 400) -> list[dict[str, Any]]:
    items = start()
    for k in range(turns):
        items += [reasoning(k), function_call(k), output(k, 0, size)]
    return items


def planned(items: list[dict[str, Any]], checkpoint: Checkpoint | None = None, **kw: Any) -> Any:
    units = units_of(items)
    inp = PlanInput(
        messages=units,
        digests=[message_digest(u) for u in units],
        counts=[COUNTER.count_message(u) for u in units],
        checkpoint=checkpoint,
        policy=kw.pop("policy", policy()),
        counter=COUNTER,
        fixed_tokens=FIXED,
        tool_tokens=TOOL_TOKENS,
        tool=kw.pop("tool", "read_result"),
        store_ok=kw.pop("store_ok", True),
        dialect=RESPONSES,
    )
    return plan(inp)


def request(out: Rewrite) -> dict[str, Any]:
    fields = RESPONSES.with_history({"tools": TOOLS}, out.messages, out.tool)
    return {"model": "gpt-test", "tools": TOOLS, **fields}


def invalid(body: dict[str, Any]) -> str | None:
    error = validate_responses_request(body, openai=True)
    if error:
        return error.message
    return check_seals(body, KEY, accept_foreign=True)


def test_a_crossing_stubs_outputs_and_the_checkpoint_holds() -> None:
    items = conversation(12)
    out = planned(items, policy=policy(target=6_000))
    assert isinstance(out, Rewrite) and out.strategy == "offload"
    assert len(out.blobs) == 11
    body = request(out)
    assert invalid(body) is None
    sent = body["input"]
    stub = sent[5]
    assert stub["type"] == "function_call_output" and stub["call_id"] == "call_0_0"
    assert f'read_result(ref="{out.blobs[0][0]}", start=' in stub["output"]
    assert sent[-1] == items[-1] and sent[:5] == items[:5]
    assert body["tools"][-1] == read_result_tool("read_result")
    assert body["tools"][-1]["strict"] is False
    grown = [*items, reasoning(99), function_call(99), output(99, 0, 300)]
    again = planned(grown, out.checkpoint, policy=policy(target=6_000))
    assert isinstance(again, Rewrite) and again.strategy == "checkpoint"
    assert orjson.dumps(flatten(again.messages)[: len(sent)]) == orjson.dumps(sent)


def test_folding_writes_a_user_summary_after_the_pinned_start() -> None:
    items = conversation(30, size=150)
    out = planned(items, policy=policy(offload_threshold=100_000))
    assert isinstance(out, FoldPlan)
    assert "[tool call exec_command id=call_0_0]" in out.transcript
    assert "## tool\n[tool result id=call_0_0]" in out.transcript
    assert "thinking about" not in out.transcript  # sealed reasoning stays sealed
    done = fold(out, "notes about src/app.py", summary="made")
    assert isinstance(done, Rewrite) and done.strategy == "summary"
    sent = request(done)["input"]
    assert sent[:3] == items[:3], "the instructions, environment and task stay first"
    assert sent[3]["role"] == "user" and "notes about src/app.py" in sent[3]["content"][0]["text"]
    assert invalid(request(done)) is None


def test_a_codex_compaction_item_is_pinned_and_untouched() -> None:
    compaction = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA" + "x" * 4000}
    items = [*start(), compaction]
    for k in range(20):
        items += [reasoning(k), function_call(k), output(k, 0, 150)]
    out = planned(items, policy=policy(offload_threshold=100_000))
    if isinstance(out, FoldPlan):
        out = fold(out, None, summary="made")
    assert isinstance(out, Rewrite)
    assert request(out)["input"][3] == compaction


def test_unknown_items_and_fields_pass_through_unchanged() -> None:
    odd = {"type": "future_item", "id": "fi_1", "payload": {"x": 1}}
    items = start()
    for k in range(10):
        call = {**function_call(k), "internal_chat_message_metadata_passthrough": {"turn": k}}
        items += [reasoning(k), odd | {"id": f"fi_{k}"}, call, output(k, 0, 400)]
    units = units_of(items)
    assert [u["unit"] for u in units[3:5]] == ["turn", "outputs"]
    assert units[3]["items"][1]["type"] == "future_item"  # inside the turn it came in
    out = planned(items, policy=policy(target=3_000))
    assert isinstance(out, Rewrite)
    sent = flatten(out.messages)
    kept_calls = [i for i in sent if i.get("type") == "function_call"]
    assert all("internal_chat_message_metadata_passthrough" in i for i in kept_calls)
    for item in sent:
        if item.get("type") == "future_item":
            assert item in items


def test_a_request_that_asks_for_a_summary_gets_no_read_result() -> None:
    out = planned(conversation(12), policy=policy(target=6_000))
    assert isinstance(out, Rewrite) and out.tool == "read_result"
    assert "read_result" in orjson.dumps(out.messages).decode()
    # Asking for a summary (routes.py Adjusted.read_result False), the planner is given
    # no tool: it writes no stub naming one, and no tool is added.
    alone = planned(conversation(12), policy=policy(target=6_000), tool=None)
    assert isinstance(alone, Rewrite) and alone.tool is None
    assert "read_result" not in orjson.dumps(alone.messages).decode()
    handoff = {"tools": [], "input": conversation(1)}
    assert "tools" not in RESPONSES.with_history(handoff, alone.messages, alone.tool)


def test_read_result_takes_a_name_no_tool_of_any_type_has() -> None:
    body: dict[str, Any] = {
        "tools": [
            {"type": "custom", "name": "read_result"},
            {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "x"}]},
        ],
        "input": [],
    }
    assert RESPONSES.tool_name(body) == "compaction_proxy_read_result"
    body["input"] = [
        {
            "type": "tool_search_output",
            "call_id": "ts1",
            "tools": [{"type": "function", "name": "compaction_proxy_read_result"}],
        }
    ]
    assert RESPONSES.tool_name(body) is None  # both names taken: offload is off
    assert RESPONSES.tool_name({"previous_response_id": "resp_1", "input": []}) is None


# -- properties ------------------------------------------------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    items = start()
    if draw(st.booleans()):
        items.append({"type": "compaction", "encrypted_content": "gAAAA" + "z" * 400})
    for k in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["tool", "tool", "tool", "custom", "chat", "web", "developer"]))
        think = [reasoning(k)] if draw(st.booleans()) else []
        if kind == "tool":
            calls = draw(st.integers(1, 3))
            text = [said(k, "looking")] if draw(st.booleans()) else []
            first = text or [function_call(k, 0)]
            items += think if not think else [think[0]]
            items += first + [function_call(k, n) for n in range(len(text) == 0, calls)]
            for n in range(calls):
                items.append(output(k, n, draw(st.integers(5, 900)), draw(st.booleans())))
        elif kind == "custom":
            call = {
                "id": f"ctc_{k:032x}",
                "type": "custom_tool_call",
                "name": "apply_patch",
                "input": "*** Begin Patch",
                "call_id": f"custom_{k}",
            }
            out = {"type": "custom_tool_call_output", "call_id": f"custom_{k}"}
            items += [*think, call, out | {"output": words(draw(st.integers(5, 900)), "p")}]
        elif kind == "chat":
            items += [*think, said(k, words(draw(st.integers(1, 200)), "a"))]
            items.append(message("user", words(draw(st.integers(1, 200)), "u")))
        elif kind == "web":
            search = {"id": f"ws_{k:032x}", "type": "web_search_call", "status": "completed"}
            items += [*think, search, said(k, "found")] if think else [search, said(k, "found")]
        else:
            items.append(message("developer", "reminder"))
    return items


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories(), st.booleans(), st.booleans())
def test_every_responses_rewrite_is_valid_fits_and_is_deterministic(
    items: list[dict[str, Any]], summarise: bool, store_ok: bool
) -> None:
    assert invalid({"model": "gpt-test", "tools": TOOLS, "input": items}) is None
    limits = policy()

    def run() -> Untouched | Rewrite | Refuse:
        out = planned(items, store_ok=store_ok)
        if isinstance(out, FoldPlan):
            return fold(out, "notes: " + out.key if summarise else None, summary="made")
        assert isinstance(out, (Untouched, Rewrite, Refuse))
        return out

    out = run()
    units = units_of(items)
    if isinstance(out, Untouched):
        history = sum(COUNTER.count_message(u) for u in units)
        assert history <= limits.trigger_tokens or out.reason == "summary_pending"
        assert history <= limits.window - FIXED - TOOL_TOKENS
        return
    if isinstance(out, Refuse):
        return
    body = request(out)
    assert invalid(body) is None, invalid(body)
    sent = body["input"]
    assert sent[-1] == items[-1]
    assert out.tokens_after <= limits.window - FIXED - TOOL_TOKENS
    pinned = [i for i in items if i.get("role") == "developer" or i.get("type") == "compaction"]
    assert all(i in sent for i in pinned), "developer messages and compaction items are kept"
    assert sent[:3] == items[:3], "the start is kept, in order"
    for item in sent:
        if item not in items:
            kind = item.get("type")
            if kind in ("function_call_output", "custom_tool_call_output"):
                assert "read_result(ref=" in orjson.dumps(item["output"]).decode()
            else:
                assert kind == "message" and item["role"] == "user", item  # summary or note
    again = run()
    assert isinstance(again, Rewrite)
    assert orjson.dumps(flatten(again.messages)) == orjson.dumps(sent)


def test_after_codex_compacts_the_old_checkpoint_stops_matching_at_no_cost() -> None:
    """Codex's compaction replaces the history: the same start, then its compaction item.
    Under the trigger that costs nothing (no store call); once it grows over again, the
    checkpoint of the same root does not apply and a fresh crossing replaces it."""

    def request(items: list[dict[str, Any]]) -> CompactionRequest:
        body = {"model": "gpt-test", "input": items, "tools": TOOLS}
        units = RESPONSES.messages(body)
        counted = count_request(RESPONSES, TokenCounter(), body, units)
        source = ClientJSON.written(body)
        return CompactionRequest(RESPONSES, body, units, counted, COUNTER, policy(), 1.0, source)

    store = Store()
    before = conversation(12)
    seen, first = commands_of(compaction(request(before)), store)
    assert isinstance(first.outcome, Rewrite) and isinstance(seen[-1], SaveCrossing)
    [old] = store.checkpoints.values()
    compacted = {"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAA" + "y" * 400}
    after = [*before[:3], compacted]
    seen, decision = commands_of(compaction(request(after)), store)
    assert seen == [] and isinstance(decision.outcome, Untouched)
    grown = after + [i for k in range(20, 32) for i in conversation(k + 1)[-3:]]
    seen, decision = commands_of(compaction(request(grown)), store)
    assert isinstance(seen[0], LoadConversation) and isinstance(decision.outcome, Rewrite)
    assert decision.rewrite is not None and decision.rewrite.strategy != "checkpoint"
    [new] = store.checkpoints.values()
    assert new != old and decision.sent is not None and compacted in decision.sent["input"]
