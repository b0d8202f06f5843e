"""The Responses API's request rules, strict like OpenAI's API: the stand-in's Responses
route (proxy/testing/responses_standin.py) answers a 400 with them, and the proxy rewrites
only a request that keeps them (docs/compaction.md, "Invalid requests"; the proxy reads
`compaction` items as OpenAI does, `openai=True`: only OpenAI's server makes them).

Each check is a pure function of the decoded body returning a `OpenAIInvalid` (the message,
`param` and `code` OpenAI puts in its 400 `invalid_request_error`) or None. Wordings are
OpenAI's where they were seen in public reports ("No tool call found for function call
output with call_id ...", "No tool output found for function call ...", "Duplicate item
found with id ...", "Invalid value: 'x'. Supported values are: ..."); the ones marked
*stand-in* below are this stand-in's own, stricter than what is known of the real API.

The rules, on `input` read in order (a string input is one user message):
- every item has a known `type`; `compaction` and `compaction_trigger` are known only when
  the stand-in plays OpenAI itself (`openai=True`), as another Responses-compatible server
  does not know them; `compaction_trigger` may only be the last item;
- item `id`s are unique; each call (`function_call`, `custom_tool_call`) has a unique
  `call_id` (*stand-in* wording), comes before its one output (a second output for the same
  call is *stand-in*), and has that output: a call without one is refused;
- when `tools` is not empty, a call in the input names one of them: a function call a
  `function` tool (or one inside a `namespace`, or one a `tool_search_output` brought in),
  a custom call a `custom` tool (*stand-in*: catches a proxy that strips its own tool from
  `tools` but leaves its calls). With `tools: []` (Codex's handoff-summary request) calls
  of any name are history and pass;
- a reasoning item the stand-in made (`rs_<32 hex>`) is followed at once by the item it
  led to (the stand-in's answer items share that suffix), as OpenAI requires ("was
  provided without its required following item");
- `previous_response_id` is refused: the stand-in stores nothing (like `store: false`).
Unknown fields on known items pass (Codex sends `internal_chat_message_metadata_passthrough`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from proxy.wire.common import OpenAIInvalid
from proxy.wire.responses_units import input_items

ROLES = ("user", "assistant", "system", "developer")
# The input item and tool types of OpenAI's published schema (the openai SDK's, 3.x).
ITEM_TYPES = (
    "message",
    "file_search_call",
    "computer_call",
    "computer_call_output",
    "web_search_call",
    "function_call",
    "function_call_output",
    "tool_search_call",
    "tool_search_output",
    "additional_tools",
    "configuration_update",
    "reasoning",
    "image_generation_call",
    "code_interpreter_call",
    "local_shell_call",
    "local_shell_call_output",
    "shell_call",
    "shell_call_output",
    "apply_patch_call",
    "apply_patch_call_output",
    "mcp_list_tools",
    "mcp_approval_request",
    "mcp_approval_response",
    "mcp_call",
    "custom_tool_call_output",
    "custom_tool_call",
    "item_reference",
    "program",
    "program_output",
)
OPENAI_ONLY_ITEM_TYPES = ("compaction", "compaction_trigger")
TOOL_TYPES = (
    "function",
    "file_search",
    "computer",
    "computer_use_preview",
    "web_search",
    "web_search_2025_08_26",
    "mcp",
    "code_interpreter",
    "programmatic_tool_calling",
    "image_generation",
    "local_shell",
    "shell",
    "custom",
    "namespace",
    "tool_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "apply_patch",
)
CALLS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}
OUTPUTS = {output: call for call, output in CALLS.items()}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
STANDIN_REASONING = re.compile(r"^rs_([0-9a-f]{32})$")


def _supported(values: tuple[str, ...]) -> str:
    quoted = [f"'{v}'" for v in values]
    return ", ".join(quoted[:-1]) + ", and " + quoted[-1]


def _invalid_value(value: Any, values: tuple[str, ...], param: str) -> OpenAIInvalid:
    return OpenAIInvalid(
        f"Invalid value: '{value}'. Supported values are: {_supported(values)}.",
        param,
        "invalid_value",
    )


def validate_responses_request(body: Any, *, openai: bool) -> OpenAIInvalid | None:
    if not isinstance(body, dict):
        return OpenAIInvalid("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return _missing_top("model")
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return OpenAIInvalid(
            "Invalid type for 'stream': expected a boolean.", "stream", "invalid_type"
        )
    limit = body.get("max_output_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 16):
        return OpenAIInvalid(
            "Invalid 'max_output_tokens': integer below minimum value."
            f" Expected a value >= 16, but got {limit} instead.",
            "max_output_tokens",
            "integer_below_min_value",
        )
    previous = body.get("previous_response_id")
    if previous is not None:
        return OpenAIInvalid(
            f"Previous response with id '{previous}' not found.",
            "previous_response_id",
            "previous_response_not_found",
        )
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return OpenAIInvalid("Invalid type for 'instructions': expected a string.", "instructions")
    value = body.get("input")
    if value is None:
        return _missing_top("input")
    if not isinstance(value, (str, list)):
        return OpenAIInvalid("Invalid type for 'input': expected a string or an array.", "input")
    tools, error = _check_tools(body.get("tools"))
    if error:
        return error
    return _check_items(input_items(body), tools, openai)


def _check_tools(tools: Any) -> tuple[dict[str, set[str]], OpenAIInvalid | None]:
    """Names offered per call kind ("function_call", "custom_tool_call"), or the error."""
    names: dict[str, set[str]] = {"function_call": set(), "custom_tool_call": set()}
    if tools is None:
        return names, None
    if not isinstance(tools, list):
        return names, OpenAIInvalid("Invalid type for 'tools': expected an array.", "tools")
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") not in TOOL_TYPES:
            kind = tool.get("type") if isinstance(tool, dict) else tool
            return names, _invalid_value(kind, TOOL_TYPES, f"{where}.type")
        inner = tool.get("tools") if tool["type"] == "namespace" else [tool]
        for member in inner if isinstance(inner, list) else []:
            kind = member.get("type") if isinstance(member, dict) else None
            if kind not in ("function", "custom"):
                continue
            name = member.get("name")
            if not isinstance(name, str) or not TOOL_NAME.match(name):
                return names, OpenAIInvalid(
                    f"Invalid '{where}.name': string does not match pattern. Expected a"
                    " string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                    f"{where}.name",
                    "invalid_value",
                )
            if name in names["function_call"] | names["custom_tool_call"]:
                return names, OpenAIInvalid(f"Duplicate tool name: '{name}'.", f"{where}.name")
            names["function_call" if kind == "function" else "custom_tool_call"].add(name)
    return names, None


def _searched_tools(items: list[Any]) -> Iterator[str]:
    """Function names a client-side tool_search brought into the conversation."""
    for item in items:
        if isinstance(item, dict) and item.get("type") == "tool_search_output":
            for tool in item.get("tools") or ():
                for member in (tool.get("tools") or [tool]) if isinstance(tool, dict) else ():
                    if isinstance(member, dict) and isinstance(member.get("name"), str):
                        yield member["name"]


def _check_items(
    items: list[Any], tools: dict[str, set[str]], openai: bool
) -> OpenAIInvalid | None:
    known = ITEM_TYPES + OPENAI_ONLY_ITEM_TYPES if openai else ITEM_TYPES
    offered = bool(tools["function_call"] or tools["custom_tool_call"])
    searched = set(_searched_tools(items))
    ids: set[str] = set()
    calls: dict[str, str] = {}  # call_id -> the call's type
    answered: set[str] = set()
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            return OpenAIInvalid(f"Invalid type for '{where}': expected an object.", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind not in known:
            return _invalid_value(kind, known, f"{where}.type")
        if kind == "compaction_trigger" and i != len(items) - 1:
            return OpenAIInvalid(
                "'compaction_trigger' must be the last input item.",
                where,  # stand-in
            )
        item_id = item.get("id")
        if item_id is not None:
            if item_id in ids:
                return OpenAIInvalid(
                    f"Duplicate item found with id {item_id}. Remove duplicate items from"
                    " your input and try again.",
                    "input",
                )
            ids.add(item_id)
        error = _check_item(item, str(kind), where) or _check_following(items, i)
        if error:
            return error
        if kind in CALLS:
            call_id = item["call_id"]
            if call_id in calls:
                return OpenAIInvalid(  # stand-in
                    f"Duplicate call_id {call_id} in input. Each call needs its own call_id.",
                    "input",
                )
            calls[call_id] = kind
            name = item["name"]
            if (
                offered
                and name not in tools[kind]
                and not (kind == "function_call" and name in searched)
            ):
                return OpenAIInvalid(  # stand-in
                    f"Invalid '{where}.name': '{name}' is not the name of a"
                    f" {'function' if kind == 'function_call' else 'custom'} tool in 'tools'.",
                    f"{where}.name",
                    "invalid_value",
                )
        elif kind in OUTPUTS:
            call_id = item["call_id"]
            if calls.get(call_id) != OUTPUTS[kind]:
                noun = "function call" if kind == "function_call_output" else "custom tool call"
                return OpenAIInvalid(
                    f"No tool call found for {noun} output with call_id {call_id}.", "input"
                )
            if call_id in answered:
                return OpenAIInvalid(  # stand-in
                    f"Duplicate output for call_id {call_id} in input.", "input"
                )
            answered.add(call_id)
    for call_id, kind in calls.items():
        if call_id not in answered:
            noun = "function call" if kind == "function_call" else "custom tool call"
            return OpenAIInvalid(f"No tool output found for {noun} {call_id}.", "input")
    return None


def _check_following(items: list[Any], i: int) -> OpenAIInvalid | None:
    item = items[i]
    if item.get("type") != "reasoning":
        return None
    match = STANDIN_REASONING.match(str(item.get("id")))
    if match is None:
        return None
    after = items[i + 1] if i + 1 < len(items) else None
    if isinstance(after, dict) and str(after.get("id", "")).endswith("_" + match.group(1)):
        return None
    return OpenAIInvalid(
        f"Item '{item['id']}' of type 'reasoning' was provided without its required"
        " following item.",
        "input",
    )


def _missing_top(field: str) -> OpenAIInvalid:
    return OpenAIInvalid(
        f"Missing required parameter: '{field}'.", field, "missing_required_parameter"
    )


def _missing(field: str, where: str) -> OpenAIInvalid:
    return OpenAIInvalid(
        f"Missing required parameter: '{where}.{field}'.",
        f"{where}.{field}",
        "missing_required_parameter",
    )


def _check_item(item: dict[str, Any], kind: str, where: str) -> OpenAIInvalid | None:
    if kind == "message":
        role = item.get("role")
        if role not in ROLES:
            return _invalid_value(role, ROLES, f"{where}.role")
        content = item.get("content")
        if not isinstance(content, (str, list)):
            return _missing("content", where)
        for k, part in enumerate(content if isinstance(content, list) else ()):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                return OpenAIInvalid(
                    f"Invalid value for '{where}.content[{k}]': expected an object with a type.",
                    f"{where}.content[{k}]",
                )
            if part["type"] in ("input_text", "output_text") and not isinstance(
                part.get("text"), str
            ):
                return _missing("text", f"{where}.content[{k}]")
        return None
    if kind in CALLS or kind in OUTPUTS:
        call_id = item.get("call_id")
        if not isinstance(call_id, str):
            return _missing("call_id", where)
        if not call_id:
            return OpenAIInvalid(
                f"Invalid '{where}.call_id': empty string. Expected a string with minimum"
                " length 1, but got an empty string instead.",
                f"{where}.call_id",
                "empty_string",
            )
    if kind in CALLS:
        if not isinstance(item.get("name"), str):
            return _missing("name", where)
        payload = "arguments" if kind == "function_call" else "input"
        if not isinstance(item.get(payload), str):
            return _missing(payload, where)
    if kind in OUTPUTS and not isinstance(item.get("output"), (str, list)):
        return _missing("output", where)
    content = item.get("encrypted_content")
    if kind in ("reasoning", "compaction") and content is not None and not isinstance(content, str):
        return OpenAIInvalid(
            f"Invalid type for '{where}.encrypted_content': expected a string.",
            f"{where}.encrypted_content",
        )
    if kind == "compaction" and not item.get("encrypted_content"):
        return _missing("encrypted_content", where)
    return None


def window_error(tokens: int, window: int) -> OpenAIInvalid | None:
    """OpenAI's Responses wording: it names neither number."""
    if tokens <= window:
        return None
    return OpenAIInvalid(
        "Your input exceeds the context window of this model. Please adjust your input and"
        " try again.",
        "input",
        "context_length_exceeded",
    )
