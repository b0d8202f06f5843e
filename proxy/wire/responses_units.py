"""OpenAI Responses `input` items as the planner's messages: units.

The planner keeps or drops whole messages and groups them with proxy/core/history.py (a
message that makes calls, then the messages answering them). Responses items are finer:
a reasoning item, the assistant's text, each function_call and each function_call_output
are separate items, and parallel calls are consecutive items. So the history is cut into
*units*, each a JSON object `{"unit": kind, "items": [...]}` that the planner counts,
hashes and stubs as one message, and that `flatten` turns back into the items, in order:

- "context": the items a conversation starts with, before any model output (Codex's
  developer instructions, its environment and task messages, the summary message or
  `compaction` item it restarts from after compacting). Pinned: never dropped or folded;
- "turn": a run of model-side items (reasoning, assistant messages, calls, server tool
  items): the calls in it and the reasoning before them stay together;
- "outputs": a run of items answering calls (`function_call_output`, ...); with the turn
  whose calls they answer it is one group, kept or dropped together;
- "message": a user, developer or system message after the start (developer and system
  are pinned, a user message is an ordinary one);
- "item": anything else on its own (`compaction`, `compaction_trigger`, `item_reference`,
  an unknown type outside a turn): pinned and passed through unchanged.

Unknown item types inside a run of model output join the turn (they are most likely model
output the API added since); unknown fields of any item pass through, since items are
never copied except where a stub replaces an output.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from proxy.core import offload
from proxy.core.history import Shape

Item = Any  # an input item: a JSON object (anything else passes through as its own unit)
Unit = dict[str, Any]

# A call the client answers, by type: the type of its answer.
CALL_ANSWERS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "computer_call": "computer_call_output",
    "tool_search_call": "tool_search_output",  # when the client executes it
    "mcp_approval_request": "mcp_approval_response",
}
ANSWER_TYPES = frozenset(CALL_ANSWERS.values())
# What the model writes (besides assistant messages and calls): joins a turn.
MODEL_SIDE = frozenset(
    {
        "reasoning",
        "web_search_call",
        "file_search_call",
        "image_generation_call",
        "code_interpreter_call",
        "mcp_call",
        "mcp_list_tools",
        "program",
        "program_output",
    }
)
# Client-side items that stand alone, wherever they are.
STANDALONE = frozenset(
    {
        "compaction",
        "compaction_trigger",
        "item_reference",
        "additional_tools",
        "configuration_update",
    }
)
# Outputs whose text can be offloaded into a stub.
STUBBABLE = frozenset({"function_call_output", "custom_tool_call_output"})
PINNED_ROLES = frozenset({"developer", "system"})
CONTEXT_TYPES = frozenset({"compaction", "additional_tools", "configuration_update"})


def item_type(item: Item) -> str:
    if not isinstance(item, dict):
        return ""
    kind = item.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in item else ""


def input_items(body: Mapping[str, Any]) -> list[Item]:
    """The input as items: a string input is one user message."""
    value = body.get("input")
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else []


def call_key(item: Item) -> str | None:
    """The id an answer names, when the item is a call the client must answer."""
    kind = item_type(item)
    if kind not in CALL_ANSWERS:
        return None
    if kind == "mcp_approval_request":
        key = item.get("id")
    elif kind == "tool_search_call" and item.get("execution") != "client":
        return None  # the server ran it: its output comes in the same answer
    else:
        key = item.get("call_id")
    return key if isinstance(key, str) and key else None


def answer_key(item: Item) -> str | None:
    """The call an item answers (its call_id), when it is an answer."""
    kind = item_type(item)
    if kind not in ANSWER_TYPES:
        return None
    key = item.get("approval_request_id" if kind == "mcp_approval_response" else "call_id")
    return key if isinstance(key, str) and key else None


def _server_output(item: Item, calls: set[str]) -> bool:
    """The output of a tool search the server ran: model output, in the same answer."""
    return item_type(item) == "tool_search_output" and answer_key(item) not in calls


def _model_side(item: Item, calls: set[str]) -> bool:
    kind = item_type(item)
    if kind == "message":
        return bool(item.get("role") == "assistant")
    return kind in CALL_ANSWERS or kind in MODEL_SIDE or _server_output(item, calls)


def units_of(items: Sequence[Item]) -> list[Unit]:
    """The items cut into units, in order (see the module doc)."""
    units: list[Unit] = []
    calls: set[str] = set()  # client calls made so far
    n = 0
    while n < len(items) and _starts_context(items[n]):
        units.append({"unit": "context", "items": [items[n]]})
        n += 1
    run: list[Item] = []
    run_kind = ""
    for item in items[n:]:
        kind = item_type(item)
        if kind in ANSWER_TYPES and not _server_output(item, calls):
            unit_kind = "outputs"  # an orphan too: its group is malformed, so dropped
        elif _model_side(item, calls) or (run_kind == "turn" and _unknown(kind)):
            unit_kind = "turn"
        else:
            unit_kind = ""
        key = call_key(item)
        if key is not None:
            calls.add(key)
        if unit_kind and unit_kind == run_kind:
            run.append(item)
            continue
        if run:
            units.append({"unit": run_kind, "items": run})
        if unit_kind:
            run, run_kind = [item], unit_kind
        else:
            run, run_kind = [], ""
            single = "message" if kind == "message" else "item"
            units.append({"unit": single, "items": [item]})
    if run:
        units.append({"unit": run_kind, "items": run})
    return units


def _starts_context(item: Item) -> bool:
    kind = item_type(item)
    if kind == "message":
        return bool(item.get("role") != "assistant")
    return kind in CONTEXT_TYPES


def _unknown(kind: str) -> bool:
    return kind not in STANDALONE and kind not in ANSWER_TYPES and kind != "message"


def flatten(units: Sequence[Mapping[str, Any]]) -> list[Item]:
    return [item for unit in units for item in unit_items(unit)]


def unit_items(unit: Mapping[str, Any]) -> list[Item]:
    items = unit.get("items")
    return items if isinstance(items, list) else []


def unit_shape(unit: Mapping[str, Any], tokens: int) -> Shape:
    kind = unit.get("unit")
    items = unit_items(unit)
    if kind == "turn":
        calls = tuple(k for k in (call_key(i) for i in items) if k is not None)
        return Shape("assistant", tokens, calls=calls)
    if kind == "outputs":
        answers = tuple(k for k in (answer_key(i) for i in items) if k is not None)
        return Shape("user", tokens, answers=answers)
    if kind == "message" and items:
        role = items[0].get("role") if isinstance(items[0], dict) else None
        if role == "user":
            return Shape("user", tokens)
        return Shape(str(role) if role in PINNED_ROLES else "message", tokens)
    # context, item, or something the proxy did not make: pinned (not an ordinary role)
    return Shape(str(kind or "item"), tokens)


# -- tool results and stubs ---------------------------------------------------------------


def output_parts(output: object) -> object:
    """An output's content as the offload rules read it: a string, or parts where text
    parts (input_text, output_text) are "text" and others keep their type."""
    if not isinstance(output, list):
        return output
    parts: list[Any] = []
    for part in output:
        if isinstance(part, dict) and part.get("type") in ("input_text", "output_text", "text"):
            parts.append({"type": "text", "text": part.get("text", "")})
        else:
            parts.append(part)
    return parts


def tool_results(unit: Mapping[str, Any]) -> list[offload.ToolResult]:
    """The stubbable outputs of an outputs unit, by item index."""
    if unit.get("unit") != "outputs":
        return []
    results = []
    for n, item in enumerate(unit_items(unit)):
        if item_type(item) in STUBBABLE:
            parts = output_parts(item.get("output"))
            results.append(
                offload.ToolResult(n, answer_key(item), parts, offload.content_text(parts))
            )
    return results


def gives_results(unit: Mapping[str, Any]) -> bool:
    """Whether an outputs unit holds a stubbable output (`tool_results` is not empty)."""
    if unit.get("unit") != "outputs":
        return False
    return any(item_type(item) in STUBBABLE for item in unit_items(unit))


def unit_with_results(unit: Mapping[str, Any], texts: Mapping[int, str]) -> Unit:
    """A copy of the unit with the outputs at these items holding these texts (as a
    string, or one input_text part where the output was a list of parts); every other
    field of the output item kept."""
    items = list(unit_items(unit))
    for index, text in texts.items():
        item = items[index]
        original = item.get("output")
        stubbed = text if isinstance(original, str) else [{"type": "input_text", "text": text}]
        items[index] = {**item, "output": stubbed}
    return {**unit, "items": items}


def text_message(role: str, text: str) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}


def user_text_unit(text: str) -> Unit:
    """A user message the proxy writes (a summary, a drop note)."""
    return {"unit": "message", "items": [text_message("user", text)]}


# -- texts --------------------------------------------------------------------------------


def part_texts(content: object) -> list[str]:
    """The texts of a message's content or an output (a string, or parts)."""
    if isinstance(content, str):
        return [content]
    texts = []
    for part in content if isinstance(content, list) else ():
        if isinstance(part, dict) and isinstance(part.get("text"), str):
            texts.append(part["text"])
    return texts


def _item_lines(item: Item) -> Iterator[tuple[str, str]]:
    """(role, text) lines of one item for a transcript; sealed content is left out."""
    kind = item_type(item)
    if kind == "message":
        text = "\n".join(part_texts(item.get("content")))
        if text:
            yield str(item.get("role", "user")), text
    elif kind == "reasoning":
        summary = "\n".join(part_texts(item.get("summary")))
        if summary:
            yield "assistant", f"[reasoning summary]\n{summary}"
    elif kind in CALL_ANSWERS:
        payload = item.get("arguments", item.get("input", item.get("action", "")))
        text = payload if isinstance(payload, str) else str(payload)
        yield "assistant", f"[tool call {item.get('name', kind)} id={call_key(item)}] {text}"
    elif kind in ANSWER_TYPES:
        text = "\n".join(part_texts(item.get("output")))
        yield "tool", f"[tool result id={answer_key(item)}]\n{text}"
    elif kind == "compaction":
        yield "context", "[an earlier part of the conversation, compacted by the API]"
    elif kind and kind != "compaction_trigger":
        yield "assistant", f"[{kind}]"


def heads_of(units: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The text the first and the last of these units begin with (for a prompt naming
    them)."""
    texts = [text for unit in units for item in unit_items(unit) for _, text in _item_lines(item)]
    return (texts[0], texts[-1]) if texts else ("", "")


def render_transcript(units: Sequence[Mapping[str, Any]]) -> str:
    """The units as plain text for the summariser."""
    parts = []
    for unit in units:
        for item in unit_items(unit):
            for role, text in _item_lines(item):
                parts.append(f"## {role}\n{text}")
    return "\n\n".join(parts)


# -- tool names ---------------------------------------------------------------------------


def _names(tool: object) -> Iterator[str]:
    if not isinstance(tool, dict):
        return
    if isinstance(tool.get("name"), str):
        yield tool["name"]
    function = tool.get("function")
    if isinstance(function, dict) and isinstance(function.get("name"), str):
        yield function["name"]
    for member in tool.get("tools") or ():  # a namespace's members
        yield from _names(member)


def tool_names(body: Mapping[str, Any]) -> set[str]:
    """Every tool name the request can call: tools of every type (functions, custom
    tools, namespaces and their members) and the tools a tool search brought in."""
    names: set[str] = set()
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        names.update(_names(tool))
    for item in input_items(body):
        if item_type(item) in ("tool_search_output", "additional_tools"):
            for tool in item.get("tools") or ():
                names.update(_names(tool))
    return names
