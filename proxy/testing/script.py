"""Scripted behaviour of the stand-in: what it answers, and which fault it injects.

`decide` turns a request's neutral reading (prompt.py) and its script into one neutral
answer (reply.py), the same for every API. A script is a JSON object: the API's defaults,
the stand-in's (`StandInOptions.script`) over them, and the keys of a request's
`x-stand-in` header over both. Keys:

- `text`: the answer text (default: a sentence giving the length of the last user text);
- `tool`: `{"name": ..., "input": {...}}`: call that client tool (stop_reason tool_use);
- `read_result`: true: call the `read_result` tool for the first stub ref in the history
  not read yet, when the request offers that tool and is not itself answering one;
  `keep_reading`: true: even when it is (a model that reads every stub, round after
  round); `read_length`: the length it asks for;
- `thinking`: true: when the request lets the model think (Messages' `thinking`, the
  Responses API's `reasoning`: there the default), start with its reasoning;
- `fault`: "429", "529", "500", "stream_error", "eof", "eof_mid" (a stream cut in the
  middle of an event), "stall"; `fault_times`: only the
  first N requests carrying that fault get it (counted per stand-in); `summary_fault`: a
  status fault ("429", "529", "500") for the proxy's summariser requests only;
  `stall_seconds` (default 30), `retry_after_ms` (default 1000); `summary_tool`: true: a
  summariser request that offers tools is answered with a call of its first tool (a model
  the tools of a summary made in place tempt away from writing notes);
- `token_delay`: seconds between streamed deltas; `chunk_tokens`: words per text delta.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter
from proxy.testing.prompt import COMPACTION, READ_RESULT, Prompt, last_user_text, next_ref_to_read
from proxy.testing.reply import Call, Reply, counted

STATUS_FAULTS = ("429", "529", "500")
STREAM_FAULTS = ("stream_error", "eof", "eof_mid", "stall")


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


def parse_script(defaults: Mapping[str, Any], header: str | None) -> Script:
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


def default_text(prompt: Prompt) -> str:
    return (
        "This is the stand-in upstream's answer. "
        f"The last user text was {len(last_user_text(prompt))} characters long."
    )


def trim_to(text: str, budget: int, counter: TokenCounter) -> str:
    words = text.split(" ")
    while len(words) > 1 and counter.count_text(" ".join(words)) > budget:
        words = words[: max(1, len(words) * 3 // 4)]
    return " ".join(words)


def _call_and_text(
    prompt: Prompt, script: Script, summary: str | None
) -> tuple[Call | None, str | None]:
    """The tool call and the text the answer carries: a summary calls a tool only when the
    script says `summary_tool` (a model the tools of a summary made in place tempt)."""
    if summary is not None:
        if script.summary_tool and prompt.tools:
            return Call(prompt.tools[0], {}), None
        return None, summary
    call = None
    ref = next_ref_to_read(prompt, script.keep_reading) if script.read_result else None
    if ref is not None:
        call = Call(READ_RESULT, {"ref": ref, "start": 0, "length": script.read_length})
    elif script.tool is not None:
        call = Call(script.tool["name"], script.tool.get("input", {}))
    text = script.text
    if text is None and call is None:
        text = default_text(prompt)
    return call, text


def decide(
    prompt: Prompt,
    script: Script,
    counter: TokenCounter,
    digest: str,
    *,
    summary: str | None = None,
) -> Reply:
    """The scripted answer to a request (`summary`: the text of a summary it asks for);
    deterministic in its inputs. Text over the output limit is cut, its call dropped."""
    if prompt.asks == COMPACTION and summary is not None:
        return counted(Reply(digest, compaction=summary), counter)
    thinking = None
    if script.thinking and prompt.reasoning and summary is None:
        thinking = f"Thinking about a request of {prompt.size} messages."
    call, text = _call_and_text(prompt, script, summary)
    reply = Reply(digest, text, (call,) if call else (), thinking)
    if text and counter.count_text(text) > prompt.max_output:
        text = trim_to(text, prompt.max_output, counter)
        reply = dataclasses.replace(reply, text=text, calls=(), cut=True)
    return counted(reply, counter)
