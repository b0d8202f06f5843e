"""Chat Completions' request rules, strict like OpenAI's API: the stand-in's Chat route
(proxy/testing/chat_standin.py) answers a 400 with them, and the proxy rewrites only a
request that keeps them (docs/compaction.md, "Invalid requests").

Each check is a pure function of the decoded body returning a `OpenAIInvalid` (the message,
`param` and `code` OpenAI puts in its 400 `invalid_request_error`) or None. Wordings are
OpenAI's where they are known, typos included ("preceeding").

The pairing rules: every assistant `tool_calls` entry needs a `tool` message answering
its id, and those tool messages come right after the assistant message (before any
other message); a tool message must answer a call of the assistant message before its
run of tool messages.
"""

from __future__ import annotations

import re
from typing import Any

from proxy.wire.common import OpenAIInvalid

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


def validate_chat_request(body: Any) -> OpenAIInvalid | None:
    if not isinstance(body, dict):
        return OpenAIInvalid("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return OpenAIInvalid("you must provide a model parameter", "model")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return OpenAIInvalid(
                f"Invalid '{name}': integer below minimum value. Expected a value >= 1.",
                name,
                "integer_below_min_value",
            )
    if "stream" in body and body["stream"] is not None and not isinstance(body["stream"], bool):
        return OpenAIInvalid("Invalid type for 'stream': expected a boolean.", "stream")
    if body.get("stream_options") is not None and body.get("stream") is not True:
        return OpenAIInvalid(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    n = body.get("n")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128):
        return OpenAIInvalid("Invalid 'n': expected a value between 1 and 128.", "n")
    return _check_tools(body.get("tools")) or _check_messages(body.get("messages"))


def _check_tools(tools: Any) -> OpenAIInvalid | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        return OpenAIInvalid("Invalid type for 'tools': expected an array.", "tools")
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            return OpenAIInvalid(f"Invalid value for '{where}.type': expected 'function'.", where)
        function = tool.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str) or not TOOL_NAME.match(name):
            return OpenAIInvalid(
                f"Invalid '{where}.function.name': string does not match pattern."
                " Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'.",
                f"{where}.function.name",
                "invalid_value",
            )
        if name in seen:
            return OpenAIInvalid(f"Duplicate tool name: '{name}'.", f"{where}.function.name")
        seen.add(name)
    return None


def _content_error(message: dict[str, Any], i: int) -> OpenAIInvalid | None:
    role = message["role"]
    content = message.get("content")
    where = f"messages.[{i}].content"
    if content is None:
        if role == "assistant" and (message.get("tool_calls") or message.get("function_call")):
            return None
        return OpenAIInvalid(
            "Invalid value for 'content': expected a string, got null.", where, "invalid_type"
        )
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return OpenAIInvalid("Invalid type for 'content': expected a string or an array.", where)
    if not content:
        return OpenAIInvalid(
            f"Invalid '{where}': empty array. Expected an array with minimum length 1,"
            " but got an empty array instead.",
            where,
            "empty_array",
        )
    for k, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return OpenAIInvalid(
                f"Invalid value for '{where}[{k}]': expected an object with a type."
            )
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            return OpenAIInvalid(f"Missing required parameter: '{where}[{k}].text'.", where)
    return None


def _check_messages(messages: Any) -> OpenAIInvalid | None:
    if not isinstance(messages, list):
        return OpenAIInvalid("Missing required parameter: 'messages'.", "messages")
    if not messages:
        return OpenAIInvalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1,"
            " but got an empty array instead.",
            "messages",
            "empty_array",
        )
    open_calls: list[str] = []  # ids of the last assistant message still unanswered
    calls_of_last: set[str] = set()  # every id the last assistant message made
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return OpenAIInvalid(f"Invalid type for 'messages[{i}]': expected an object.")
        role = message.get("role")
        if role not in ROLES:
            supported = "'system', 'assistant', 'user', 'function', 'tool', and 'developer'"
            return OpenAIInvalid(
                f"Invalid value: '{role}'. Supported values are: {supported}.",
                f"messages[{i}].role",
                "invalid_value",
            )
        error = _content_error(message, i)
        if error:
            return error
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not calls_of_last:
                return OpenAIInvalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a"
                    " preceeding message with 'tool_calls'.",
                    f"messages.[{i}].role",
                )
            if call_id not in calls_of_last:
                return OpenAIInvalid(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in"
                    " 'tool_calls' of previous message.",
                    f"messages.[{i}].tool_call_id",
                )
            if call_id in open_calls:
                open_calls.remove(call_id)
            continue
        if open_calls:
            return _unanswered(open_calls, i)
        calls_of_last = set()
        if role == "assistant":
            ids, error = _tool_call_ids(message, i)
            if error:
                return error
            open_calls, calls_of_last = list(ids), set(ids)
    if open_calls:
        return _unanswered(open_calls, len(messages))
    return None


def _tool_call_ids(message: dict[str, Any], i: int) -> tuple[list[str], OpenAIInvalid | None]:
    calls = message.get("tool_calls")
    if calls is None:
        return [], None
    if not isinstance(calls, list):
        return [], OpenAIInvalid("Invalid type for 'tool_calls': expected an array.")
    ids = []
    for k, call in enumerate(calls):
        where = f"messages.[{i}].tool_calls.[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if (
            not isinstance(call, dict)
            or not isinstance(call.get("id"), str)
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("arguments"), str)
        ):
            return [], OpenAIInvalid(f"Invalid value for '{where}'.", where)
        ids.append(call["id"])
    return ids, None


def _unanswered(ids: list[str], i: int) -> OpenAIInvalid:
    return OpenAIInvalid(
        "An assistant message with 'tool_calls' must be followed by tool messages responding"
        " to each 'tool_call_id'. The following tool_call_ids did not have response"
        f" messages: {', '.join(ids)}",
        f"messages.[{i}].role",
    )


def window_error(tokens: int, window: int) -> OpenAIInvalid | None:
    if tokens <= window:
        return None
    return OpenAIInvalid(
        f"This model's maximum context length is {window} tokens. However, your messages"
        f" resulted in {tokens} tokens. Please reduce the length of the messages.",
        "messages",
        "context_length_exceeded",
    )
