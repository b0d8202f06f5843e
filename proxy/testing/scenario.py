"""Scenarios: scripting an unmodified agent's session, keyed by what each request holds.

An agent such as Claude Code cannot send the `x-stand-in` header, so the stand-in reads
what to answer from the request itself. A scenario is a list of steps; each step calls a
client tool (e.g. `Bash` with a command whose output is large) or answers with final
text, optionally after calling `read_result` a number of times when the request offers
it. Progress is read from the history: the stand-in's tool_use ids carry their step
(`toolu_step007_...`), and the proxy keeps the newest tool result verbatim, so the last
client tool result says which step was done; the `read_result` calls after it say how
many reads of the next step were made. A history an agent compacted by itself keeps the
step in the summary the stand-in wrote for it.

Requests that are not the agent's main loop are answered too: the agent's own
compaction request (its summarisation prompt: answered with a summary) and side requests
that do not offer the scenario's tool (titles, quota probes, small-model calls: a short
text, or the smallest JSON that fits the schema the request asks for). Every request's
kind is recorded, so a test can assert, e.g., that the agent never compacted by itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter
from proxy.testing.script import READ_RESULT, STUB_REF, Answer, output_tokens, trim_to

# What the stand-in answers, by the kind of request (recorded as RecordedRequest.kind).
TOOL = "tool"  # a step calling the client tool
READ = "read"  # a read_result call before a step's action
TEXT = "text"  # a step answering with text (the last one ends the session)
SIDE = "side"  # a request that does not offer the scenario's tool
COMPACTION = "compaction"  # the agent asks for a summary of its own history
SUMMARY = "summary"  # the proxy's own summariser call (not the scenario's business)

# Claude Code's summarisation prompt (2.1.x), the last user message of its compaction
# request, and the first words of the history it continues with afterwards.
COMPACTION_PROMPTS = (
    "Your task is to create a detailed summary of",
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",
)
CONTINUATION = "This session is being continued from a previous conversation"
# What Claude Code puts in place of an old tool result it clears by itself (microcompact).
CLEARED = "[Old tool result content cleared]"

STEP_ID = re.compile(r"^toolu_step(\d{3})_")
STEP_NOTE = re.compile(r"\[scenario: step (\d+) done\]")


@dataclass(frozen=True)
class Step:
    # Client tool calls ({"name", "input"}), made together in one answer.
    calls: tuple[Mapping[str, Any], ...] = ()
    text: str | None = None  # with calls: said before them; alone: the final answer
    reads: int = 0  # read_result calls first, one per answer, when the request offers it
    read_length: int = 2000


@dataclass(frozen=True)
class Scenario:
    steps: tuple[Step, ...]
    tool_name: str = "Bash"  # a request that does not offer it is a side request
    side_text: str = "OK."
    done_text: str = "The scenario is complete."  # past the last step

    def __post_init__(self) -> None:
        if len(self.steps) > 999:
            raise ValueError("a scenario has at most 999 steps")


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [b for b in content if isinstance(b, dict)]
    return []


def _texts(messages: Iterable[Mapping[str, Any]]) -> Iterable[str]:
    for message in messages:
        for block in _blocks(message.get("content")):
            if block.get("type") == "text":
                yield str(block.get("text") or "")
            elif block.get("type") == "tool_result":
                for inner in _blocks(block.get("content")):
                    if inner.get("type") == "text":
                        yield str(inner.get("text") or "")


def offers(body: Mapping[str, Any], name: str) -> bool:
    return any(isinstance(t, dict) and t.get("name") == name for t in body.get("tools") or [])


def is_compaction_request(body: Mapping[str, Any]) -> bool:
    """The agent asks for a summary of its own history (Claude Code's wording)."""
    messages = body.get("messages") or []
    last_user = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    if last_user is None:
        return False
    text = "\n".join(_texts([last_user]))
    return any(prompt in text for prompt in COMPACTION_PROMPTS)


def continues_after_compaction(body: Mapping[str, Any]) -> bool:
    """The history starts over from a summary the agent made by itself."""
    return any(CONTINUATION in text for text in _texts(body.get("messages") or []))


def cleared_results(body: Mapping[str, Any]) -> int:
    """Tool results the agent replaced by its own "cleared" marker."""
    return sum(
        CLEARED in text
        for message in body.get("messages") or []
        for block in _blocks(message.get("content"))
        if block.get("type") == "tool_result"
        for text in _texts([{"content": [block]}])
    )


@dataclass(frozen=True)
class Progress:
    done: int  # the last step whose tool call was answered (-1: none yet)
    reads: int  # read_result calls made since that answer


def progress(body: Mapping[str, Any]) -> Progress:
    """Where the session is, from the history alone."""
    messages: Sequence[Mapping[str, Any]] = body.get("messages") or []
    names: dict[str, str] = {}
    done, reads, found = -1, 0, False
    for message in messages:
        for block in _blocks(message.get("content")):
            kind = block.get("type")
            if kind == "tool_use":
                names[str(block.get("id"))] = str(block.get("name"))
                if block.get("name") == READ_RESULT:
                    reads += 1
            elif kind == "tool_result":
                tool_use_id = str(block.get("tool_use_id"))
                if names.get(tool_use_id) == READ_RESULT:
                    continue
                step = STEP_ID.match(tool_use_id)
                if step:
                    done, reads, found = int(step.group(1)), 0, True
    if not found:  # a history the agent compacted: the summary names the step
        notes = [int(n) for text in _texts(messages) for n in STEP_NOTE.findall(text)]
        if notes:
            done = notes[-1]
    return Progress(done, reads)


def stub_refs(body: Mapping[str, Any]) -> list[str]:
    """Refs named in the history, first seen first, each once."""
    refs: dict[str, None] = {}
    for text in _texts(body.get("messages") or []):
        for ref in STUB_REF.findall(text):
            refs.setdefault(ref, None)
    return list(refs)


def choose(scenario: Scenario, body: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """The kind of the request and the answer's blocks (tool_use ids are prefixes, to
    which the caller appends the request's hash); deterministic in the body."""
    where = progress(body)
    if is_compaction_request(body):
        summary = (
            "<analysis>The session ran a scripted sequence of shell commands.</analysis>\n"
            f"<summary>Shell commands were run step by step. [scenario: step {where.done} done]"
            "</summary>"
        )
        return COMPACTION, [_text(summary)]
    if not offers(body, scenario.tool_name):
        schema = _output_schema(body)
        if schema is not None:  # e.g. Claude Code's session title: {"title": ...}
            filled = orjson.dumps(_fill(schema, scenario.side_text)).decode()
            return SIDE, [_text(filled)]
        return SIDE, [_text(scenario.side_text)]
    index = where.done + 1
    if index >= len(scenario.steps):
        return TEXT, [_text(scenario.done_text)]
    step = scenario.steps[index]
    refs = stub_refs(body) if offers(body, READ_RESULT) else []
    if where.reads < step.reads and refs:
        ref = refs[-1 - where.reads % len(refs)]  # newest stubs first
        read = {"ref": ref, "start": 0, "length": step.read_length}
        return READ, [_call(f"toolu_step{index:03d}_r", READ_RESULT, read)]
    if not step.calls:
        return TEXT, [_text(step.text or scenario.done_text)]
    blocks = [_text(step.text)] if step.text else []
    for k, call in enumerate(step.calls):
        blocks.append(_call(f"toolu_step{index:03d}_{k}", call["name"], call.get("input", {})))
    return TOOL, blocks


def _output_schema(body: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The JSON schema the request asks the answer to follow (structured outputs)."""
    config = body.get("output_config")
    fmt = config.get("format") if isinstance(config, Mapping) else None
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
        schema = fmt.get("schema")
        return schema if isinstance(schema, Mapping) else None
    return None


def _fill(schema: Mapping[str, Any], text: str) -> Any:
    """A small value of the schema: required properties only, strings set to `text`."""
    kind = schema.get("type")
    if schema.get("enum"):
        return schema["enum"][0]
    if kind == "object":
        properties = schema.get("properties") or {}
        return {
            name: _fill(properties.get(name) or {}, text) for name in schema.get("required") or []
        }
    return {"string": text, "array": [], "boolean": False}.get(str(kind), 0)


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _call(id_prefix: str, name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": id_prefix, "name": name, "input": dict(arguments)}


def scenario_answer(
    scenario: Scenario, body: Mapping[str, Any], counter: TokenCounter, request_hash: str
) -> tuple[str, Answer]:
    """The kind of the request and the stand-in's whole answer to it: tool_use ids end in
    the request's hash; text over `max_tokens` is cut (stop_reason max_tokens)."""
    kind, blocks = choose(scenario, body)
    for block in blocks:
        if block["type"] == "tool_use":
            block["id"] = (block["id"] + request_hash)[:32]
    stop = "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn"
    max_tokens = int(body.get("max_tokens") or 0) or 4096
    if stop == "end_turn" and counter.count_text(blocks[0]["text"]) > max_tokens:
        blocks[0]["text"] = trim_to(blocks[0]["text"], max_tokens, counter)
        stop = "max_tokens"
    return kind, Answer(blocks, stop, output_tokens(blocks, counter))
