"""Scripted behaviour of the stand-in: what it answers, and which fault it injects.

A script is a JSON object: the stand-in's default (`StandInOptions.script`), with the keys
of a request's `x-stand-in` header laid over it. Keys:

- `text`: the answer text (default: a sentence giving the length of the last user text);
- `tool`: `{"name": ..., "input": {...}}`: call that client tool (stop_reason tool_use);
- `read_result`: true: call the `read_result` tool for the first stub ref in the history
  not read yet, when the request offers that tool and is not itself answering one;
  `keep_reading`: true: even when it is (a model that reads every stub, round after
  round); `read_length`: the length it asks for;
- `thinking`: true: with thinking on, start the answer with a signed thinking block;
- `fault`: "429", "529", "500", "stream_error", "eof", "stall"; `fault_times`: only the
  first N requests carrying that fault get it (counted per stand-in); `summary_fault`: a
  status fault ("429", "529", "500") for the proxy's summariser requests only;
  `stall_seconds` (default 30), `retry_after_ms` (default 1000); `summary_tool`: true: a
  summariser request that offers tools is answered with a call of its first tool (a model
  the tools of a summary made in place tempt away from writing notes);
- `token_delay`: seconds between streamed deltas; `chunk_tokens`: words per text delta.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter
from proxy.wire.anthropic_validation import thinking_signature

STATUS_FAULTS = ("429", "529", "500")
STREAM_FAULTS = ("stream_error", "eof", "stall")
READ_RESULT = "read_result"
STUB_REF = re.compile(r'read_result\(ref="(r_[0-9a-f]{16,})"')


class ScriptError(ValueError):
    """A script the stand-in cannot follow; the message goes into a 400."""


@dataclass(frozen=True)
class Script:
    text: str | None = None
    tool: dict[str, Any] | None = None
    read_result: bool = False
    keep_reading: bool = False
    thinking: bool = False
    fault: str | None = None
    fault_times: int | None = None
    summary_fault: str | None = None
    summary_tool: bool = False
    stall_seconds: float = 30.0
    retry_after_ms: float = 1000.0
    token_delay: float = 0.0
    chunk_tokens: int = 8
    read_length: int = 2000


_KEYS = {f.name for f in fields(Script)}


def parse_script(defaults: dict[str, Any], header: str | None) -> Script:
    merged = dict(defaults)
    if header:
        try:
            override = orjson.loads(header)
        except orjson.JSONDecodeError as exc:
            raise ScriptError(f"x-stand-in: invalid JSON: {exc}") from None
        if not isinstance(override, dict):
            raise ScriptError("x-stand-in: must be a JSON object")
        merged.update(override)
    if isinstance(merged.get("fault"), int):
        merged["fault"] = str(merged["fault"])
    unknown = sorted(set(merged) - _KEYS)
    if unknown:
        raise ScriptError(f"x-stand-in: unknown keys: {', '.join(unknown)}")
    script = Script(**merged)
    if script.fault is not None and script.fault not in STATUS_FAULTS + STREAM_FAULTS:
        raise ScriptError(f"x-stand-in: unknown fault {script.fault!r}")
    if script.summary_fault is not None and script.summary_fault not in STATUS_FAULTS:
        raise ScriptError(f"x-stand-in: unknown summary_fault {script.summary_fault!r}")
    tool = script.tool
    if tool is not None and (
        not isinstance(tool, dict)
        or not isinstance(tool.get("name"), str)
        or not isinstance(tool.get("input", {}), dict)
    ):
        raise ScriptError('x-stand-in: tool must be {"name": str, "input": object}')
    if script.chunk_tokens < 1:
        raise ScriptError("x-stand-in: chunk_tokens must be at least 1")
    return script


@dataclass(frozen=True)
class Answer:
    content: list[dict[str, Any]]
    stop_reason: str
    output_tokens: int


def _blocks(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def last_user_text(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return "\n".join(
                b["text"]
                for b in _blocks(message.get("content"))
                if isinstance(b, dict) and b.get("type") == "text"
            )
    return ""


def default_text(body: dict[str, Any]) -> str:
    return (
        "This is the stand-in upstream's answer. "
        f"The last user text was {len(last_user_text(body))} characters long."
    )


def _texts_of(block: dict[str, Any]) -> list[str]:
    if block.get("type") == "text":
        return [block.get("text") or ""]
    if block.get("type") == "tool_result":
        return [t for inner in _blocks(block.get("content")) for t in _texts_of(inner)]
    return []


def next_ref_to_read(body: dict[str, Any], keep_reading: bool = False) -> str | None:
    """The first stub ref of the history not read yet, if read_result should be called
    (not right after a read's result, unless `keep_reading`)."""
    tools = body.get("tools") or []
    if not any(isinstance(t, dict) and t.get("name") == READ_RESULT for t in tools):
        return None
    messages = body.get("messages") or []
    read_calls: dict[str, str] = {}  # tool_use id -> ref
    refs: list[str] = []
    for message in messages:
        for block in _blocks(message.get("content")):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and block.get("name") == READ_RESULT:
                read_calls[block.get("id", "")] = str((block.get("input") or {}).get("ref"))
            for text in _texts_of(block):
                refs.extend(STUB_REF.findall(text))
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if (
        not keep_reading
        and last_user is not None
        and any(
            isinstance(b, dict)
            and b.get("type") == "tool_result"
            and b.get("tool_use_id") in read_calls
            for b in _blocks(last_user.get("content"))
        )
    ):
        return None
    already = set(read_calls.values())
    return next((ref for ref in refs if ref not in already), None)


def _thinking_on(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def trim_to(text: str, budget: int, counter: TokenCounter) -> str:
    words = text.split(" ")
    while len(words) > 1 and counter.count_text(" ".join(words)) > budget:
        words = words[: max(1, len(words) * 3 // 4)]
    return " ".join(words)


def plan_call(
    body: dict[str, Any],
    script: Script,
    ref_to_read: Callable[[dict[str, Any], bool], str | None],
    text_override: str | None,
) -> tuple[dict[str, Any] | None, str | None]:
    """The tool call (`{"name", "input"}`) and the text the answer carries, either format:
    a summary (`text_override`) calls a tool only when the script says `summary_tool`."""
    call: dict[str, Any] | None = None
    tools = body.get("tools")
    if text_override is not None and script.summary_tool and isinstance(tools, list) and tools:
        first = tools[0] if isinstance(tools[0], dict) else {}
        name = first.get("name") or (first.get("function") or {}).get("name") or "tool"
        return {"name": str(name), "input": {}}, None
    reads = script.read_result and text_override is None
    ref = ref_to_read(body, script.keep_reading) if reads else None
    if ref is not None:
        read = {"ref": ref, "start": 0, "length": script.read_length}
        call = {"name": READ_RESULT, "input": read}
    elif script.tool is not None and text_override is None:
        call = {"name": script.tool["name"], "input": script.tool.get("input", {})}
    text = text_override if text_override is not None else script.text
    if text is None and call is None:
        text = default_text(body)
    return call, text


def plan_answer(
    body: dict[str, Any],
    script: Script,
    counter: TokenCounter,
    request_hash: str,
    *,
    text_override: str | None = None,
) -> Answer:
    """The answer's content blocks and stop reason; deterministic in its inputs."""
    content: list[dict[str, Any]] = []
    if script.thinking and _thinking_on(body):
        thought = f"Thinking about a request of {len(body.get('messages') or [])} messages."
        content.append(
            {"type": "thinking", "thinking": thought, "signature": thinking_signature(thought)}
        )

    call, text = plan_call(body, script, next_ref_to_read, text_override)
    stop_reason = "tool_use" if call is not None else "end_turn"

    max_tokens = int(body.get("max_tokens") or 0) or 4096
    if text:
        if counter.count_text(text) > max_tokens:
            text = trim_to(text, max_tokens, counter)
            call, stop_reason = None, "max_tokens"
        content.append({"type": "text", "text": text})
    if call is not None:
        content.append({"type": "tool_use", "id": f"toolu_{request_hash[:24]}", **call})
    return Answer(content, stop_reason, output_tokens(content, counter))


def output_tokens(content: list[dict[str, Any]], counter: TokenCounter) -> int:
    total = 0
    for block in content:
        if block["type"] == "text":
            total += counter.count_text(block["text"])
        elif block["type"] == "thinking":
            total += counter.count_text(block["thinking"])
        else:
            total += counter.count_text(block["name"]) + counter.count_json(block["input"])
    return max(1, total)
