"""The Gemini API's request rules, as pure checks shared by the strict stand-in and the
proxy (one copy: the proxy never holds a rule the stand-in does not, nor the reverse).

Each check returns the first `Violation` in the order the API meets them (the JSON
first, then the history), with the API's wording where it is known and the field it
names. A violation has a `level`, which says who acts on it:

- `STRUCTURE`: the body cannot be read as a request (contents not a list, a part not an
  object...): the proxy answers 400 itself, naming the field;
- `HISTORY`: the contents break the API's rules (function calls and responses out of
  place or miscounted, an empty part, a Gemini 3 function call turn of the current turn
  without its thought signature): the proxy never rewrites or summarises such a history;
  it goes up as sent, and the API's own refusal reaches the client;
- `STRICT`: what only the API (and the stand-in) refuses: unknown fields, bad tool
  declarations, tools beside a JSON answer or a cached prefix. The proxy passes them on:
  what it does not know it never drops.

The history rules: a model turn with function calls comes right after a user turn; the
user turn after it answers every call, one functionResponse each (counted, not matched
by id: the API sends no ids); a functionResponse turn comes only right after a function
call turn. Gemini 3 checks thought signatures in the current turn only (the contents
after the last user turn that is not only function responses): there, each model turn
with function calls needs a `thoughtSignature` on its first call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from proxy.wire.gemini_parts import DATA_FIELDS, field, function_calls, snake

THOUGHT_SIGNATURE_DOCS = "https://ai.google.dev/gemini-api/docs/thought-signatures"
FUNCTION_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$")


class Level(IntEnum):
    STRUCTURE = 1
    HISTORY = 2
    STRICT = 3


@dataclass(frozen=True, slots=True)
class Violation:
    message: str
    field: str  # the field it names, as the API writes a path (contents[2].parts)
    level: Level
    status: int = 400


# The fields the API knows (camelCase; snake_case is read alike).
REQUEST_FIELDS = frozenset(
    {
        "model",
        "contents",
        "systemInstruction",
        "tools",
        "toolConfig",
        "safetySettings",
        "generationConfig",
        "cachedContent",
        "labels",
        "serviceTier",
        "store",
    }
)
CONTENT_FIELDS = frozenset({"role", "parts"})
PART_FIELDS = frozenset(
    {
        *DATA_FIELDS,
        "thought",
        "thoughtSignature",
        "videoMetadata",
        "mediaResolution",
        "partMetadata",
    }
)
TOOL_FIELDS = frozenset(
    {
        "functionDeclarations",
        "googleSearch",
        "googleSearchRetrieval",
        "codeExecution",
        "urlContext",
        "fileSearch",
        "googleMaps",
        "computerUse",
        "mcpServers",
        "enterpriseWebSearch",
    }
)
DECLARATION_FIELDS = frozenset(
    {
        "name",
        "description",
        "parameters",
        "parametersJsonSchema",
        "response",
        "responseJsonSchema",
        "behavior",
    }
)


def _known(name: str, known: frozenset[str]) -> bool:
    return name in known or any(snake(k) == name for k in known)


def _unknown(obj: Mapping[str, Any], known: frozenset[str], where: str) -> Violation | None:
    for name in obj:
        if not _known(name, known):
            at = f" at '{where}'" if where else ""
            return Violation(
                f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.',
                f"{where}.{name}" if where else name,
                Level.STRICT,
            )
    return None


def _invalid(where: str, expected: str, value: object, level: Level) -> Violation:
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return Violation(
        f"Invalid JSON payload received. Invalid value at '{where}' ({expected}), {shown}",
        where,
        level,
    )


def _bad_request(where: str, message: str, level: Level) -> Violation:
    return Violation(f"* GenerateContentRequest.{where}: {message}", where, level)


# -- the checks ----------------------------------------------------------------------------


def check_request(body: object, model: str) -> Violation | None:
    """Every rule, the first broken one (what the API answers 400 with)."""
    found = structure_violation(body)
    if found is not None or not isinstance(body, dict):
        return found
    return _strict_violation(body) or history_violation(body, model)


def structure_violation(body: object) -> Violation | None:
    """What makes a body unreadable as a request: the proxy refuses it itself."""
    if not isinstance(body, dict):
        return Violation("Invalid JSON payload received. Expected an object.", "", Level.STRUCTURE)
    contents = body.get("contents")
    if contents is not None and not isinstance(contents, list):
        return _invalid("contents", "type.googleapis.com/Content", contents, Level.STRUCTURE)
    for i, content in enumerate(contents or ()):
        where = f"contents[{i}]"
        if not isinstance(content, dict):
            return _invalid(where, "type.googleapis.com/Content", content, Level.STRUCTURE)
        parts = content.get("parts")
        if parts is not None and not isinstance(parts, list):
            return _invalid(f"{where}.parts", "type.googleapis.com/Part", parts, Level.STRUCTURE)
        for k, part in enumerate(parts or ()):
            if not isinstance(part, dict):
                return _invalid(
                    f"{where}.parts[{k}]", "type.googleapis.com/Part", part, Level.STRUCTURE
                )
    for name in ("systemInstruction", "generationConfig", "toolConfig"):
        value = field(body, name)
        if value is not None and not isinstance(value, dict):
            return _invalid(snake(name), "an object", value, Level.STRUCTURE)
    tools = body.get("tools")
    if tools is not None and not (
        isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
    ):
        return _invalid("tools", "a list of Tool", tools, Level.STRUCTURE)
    return None


def history_violation(body: Mapping[str, Any], model: str) -> Violation | None:
    """What breaks the API's history rules: the proxy never rewrites such a history."""
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        return _bad_request("contents", "contents is not specified", Level.HISTORY)
    for i, content in enumerate(contents):
        found = _content_violation(content, i)
        if found is not None:
            return found
    return _pairing_violation(contents) or _signature_violation(contents, model)


def _content_violation(content: Mapping[str, Any], i: int) -> Violation | None:
    where = f"contents[{i}]"
    role = content.get("role")
    if role is not None and role not in ("user", "model", ""):
        return Violation("Please use a valid role: user, model.", f"{where}.role", Level.HISTORY)
    parts = content.get("parts")
    if not parts:
        return _bad_request(f"{where}.parts", "contents.parts must not be empty.", Level.HISTORY)
    for k, part in enumerate(parts):
        found = _part_violation(part, f"{where}.parts[{k}]")
        if found is not None:
            return found
    return None


def _part_violation(part: Mapping[str, Any], where: str) -> Violation | None:
    present = [name for name in DATA_FIELDS if field(part, name) is not None]
    text = field(part, "text")
    signed = field(part, "thoughtSignature") is not None
    if not present or (present == ["text"] and text == "" and not signed):
        return _bad_request(
            f"{where}.data",
            "required oneof field 'data' must have one initialized field",
            Level.HISTORY,
        )
    if len(present) > 1:
        return Violation(
            f"Invalid JSON payload received. Oneof field 'data' is already set."
            f" Cannot set '{present[1]}'",
            f"{where}.{present[1]}",
            Level.HISTORY,
        )
    if text is not None and not isinstance(text, str):
        return _invalid(f"{where}.text", "TYPE_STRING", text, Level.HISTORY)
    signature = field(part, "thoughtSignature")
    if signature is not None and not isinstance(signature, str):
        return _invalid(f"{where}.thought_signature", "TYPE_BYTES", signature, Level.HISTORY)
    call = field(part, "functionCall")
    if call is not None and (not isinstance(call, dict) or not isinstance(call.get("name"), str)):
        return _bad_request(f"{where}.function_call.name", "Name is required.", Level.HISTORY)
    response = field(part, "functionResponse")
    if response is not None:
        if not isinstance(response, dict) or not isinstance(response.get("name"), str):
            return _bad_request(
                f"{where}.function_response.name", "Name is required.", Level.HISTORY
            )
        if response.get("response") is not None and not isinstance(response["response"], dict):
            return _invalid(
                f"{where}.function_response.response",
                "type.googleapis.com/google.protobuf.Struct",
                response["response"],
                Level.HISTORY,
            )
    return None


def _responses(content: Mapping[str, Any]) -> int:
    return sum(
        1
        for p in content.get("parts") or ()
        if isinstance(p, dict) and field(p, "functionResponse") is not None
    )


def _pairing_violation(contents: list[Any]) -> Violation | None:
    """Function call turns after a user turn; a response turn right after a call turn,
    answering every call."""
    previous: Mapping[str, Any] | None = None
    for i, content in enumerate(contents):
        calls = len(function_calls(content))
        responses = _responses(content)
        model = content.get("role") == "model"
        if previous is not None and previous.get("role") == "model":
            expected = len(function_calls(previous))
            if expected and responses != expected:
                return Violation(
                    "Please ensure that the number of function response parts is equal to"
                    " the number of function call parts of the function call turn.",
                    f"contents[{i}]",
                    Level.HISTORY,
                )
        if model and calls and (previous is None or previous.get("role") == "model"):
            return Violation(
                "Please ensure that function call turn comes immediately after a user turn"
                " or after a function response turn.",
                f"contents[{i}]",
                Level.HISTORY,
            )
        if responses and not (
            previous is not None
            and previous.get("role") == "model"
            and function_calls(previous)
            and not model
        ):
            return Violation(
                "Please ensure that function response turn comes immediately after a"
                " function call turn.",
                f"contents[{i}]",
                Level.HISTORY,
            )
        previous = content
    if previous is not None and previous.get("role") == "model" and function_calls(previous):
        return Violation(
            "Please ensure that the number of function response parts is equal to the"
            " number of function call parts of the function call turn.",
            f"contents[{len(contents)}]",
            Level.HISTORY,
        )
    return None


def checks_signatures(model: str) -> bool:
    """Gemini 3 and later refuse a function call turn that lost its signature."""
    name = model.rsplit("/", 1)[-1].lower()
    found = re.match(r"gemini-(\d+)", name)
    return found is not None and int(found.group(1)) >= 3


def current_turn(contents: list[Any]) -> int:
    """Where the current turn starts: after the last user turn that is not only function
    responses (the API checks signatures from there on)."""
    for i in range(len(contents) - 1, -1, -1):
        content = contents[i]
        if content.get("role") == "model":
            continue
        parts = content.get("parts") or ()
        if any(isinstance(p, dict) and field(p, "functionResponse") is None for p in parts):
            return i + 1
    return 0


def _signature_violation(contents: list[Any], model: str) -> Violation | None:
    if not checks_signatures(model):
        return None
    for i in range(current_turn(contents), len(contents)):
        calls = function_calls(contents[i]) if contents[i].get("role") == "model" else []
        if calls and field(calls[0], "thoughtSignature") is None:
            name = field(calls[0], "functionCall").get("name")
            return Violation(
                "Function call is missing a thought_signature in functionCall parts. This is"
                " required for tools to work correctly, and missing thought_signature may lead"
                f" to degraded model performance. Additional data, function call"
                f" `default_api:{name}`, position {i + 1}. Please refer to"
                f" {THOUGHT_SIGNATURE_DOCS} for more details.",
                f"contents[{i}].parts",
                Level.HISTORY,
            )
    return None


# -- what only the API refuses -------------------------------------------------------------


def _strict_violation(body: Mapping[str, Any]) -> Violation | None:
    found = _unknown(body, REQUEST_FIELDS, "")
    if found is not None:
        return found
    for i, content in enumerate(body.get("contents") or ()):
        found = _unknown(content, CONTENT_FIELDS, f"contents[{i}]")
        for k, part in enumerate(content.get("parts") or ()):
            found = found or _unknown(part, PART_FIELDS, f"contents[{i}].parts[{k}]")
        if found is not None:
            return found
    return _tools_violation(body) or _combination_violation(body)


def _tools_violation(body: Mapping[str, Any]) -> Violation | None:
    seen: set[str] = set()
    for t, tool in enumerate(body.get("tools") or ()):
        found = _unknown(tool, TOOL_FIELDS, f"tools[{t}]")
        if found is not None:
            return found
        declarations = field(tool, "functionDeclarations") or []
        if not isinstance(declarations, list):
            return _invalid(
                f"tools[{t}].function_declarations", "a list", declarations, Level.STRICT
            )
        for d, declaration in enumerate(declarations):
            where = f"tools[{t}].function_declarations[{d}]"
            if not isinstance(declaration, dict):
                return _invalid(where, "type.googleapis.com/FunctionDeclaration", declaration,
                                Level.STRICT)  # fmt: skip
            found = _unknown(declaration, DECLARATION_FIELDS, where)
            if found is not None:
                return found
            name = declaration.get("name")
            if not isinstance(name, str) or not FUNCTION_NAME.match(name):
                return _bad_request(
                    f"{where}.name",
                    "Invalid function name. Must start with a letter or an underscore. Must be"
                    " a-z, A-Z, 0-9, or contain underscores, dots, colons and dashes, with a"
                    " maximum length of 64.",
                    Level.STRICT,
                )
            if name in seen:
                return _bad_request(
                    f"{where}.name", f"Duplicate function declaration found: {name}", Level.STRICT
                )
            seen.add(name)
            if field(declaration, "parameters") is not None and (
                field(declaration, "parametersJsonSchema") is not None
            ):
                return _bad_request(
                    f"{where}.parameters",
                    "parameters and parameters_json_schema cannot both be set.",
                    Level.STRICT,
                )
    return None


def _combination_violation(body: Mapping[str, Any]) -> Violation | None:
    declares = any(field(t, "functionDeclarations") for t in body.get("tools") or ())
    config = field(body, "generationConfig") or {}
    mime = field(config, "responseMimeType")
    if declares and isinstance(mime, str) and mime.lower().startswith("application/json"):
        return Violation(
            "Function calling with a response mime type: 'application/json' is unsupported",
            "generation_config.response_mime_type",
            Level.STRICT,
        )
    limit = field(config, "maxOutputTokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        return _invalid("generation_config.max_output_tokens", "TYPE_INT32", limit, Level.STRICT)
    cached = field(body, "cachedContent")
    if cached is not None and any(
        field(body, k) is not None for k in ("systemInstruction", "tools", "toolConfig")
    ):
        return Violation(
            "CachedContent can not be used with GenerateContent request setting"
            " system_instruction, tools or tool_config.\n\nProposed fix: move those values to"
            " CachedContent from GenerateContent request.",
            "cached_content",
            Level.STRICT,
        )
    return None
