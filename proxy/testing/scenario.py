"""Scenarios: scripting an unmodified agent's session, keyed by what each request holds.

An agent such as Claude Code cannot send the `x-stand-in` header, so the stand-in reads
what to answer from the request itself (its neutral reading, prompt.py: any API's). A
scenario is a list of steps; each step calls a client tool (e.g. `Bash` with a command
whose output is large) or answers with final text, optionally after calling
`read_result` a number of times when the request offers it. Progress is read from the
history: the stand-in's tool call ids carry their step (`toolu_step007_...`), and the
proxy keeps the newest tool result verbatim, so the last client tool result says which
step was done; the `read_result` calls after it say how many reads of the next step were
made. A history an agent compacted by itself keeps the step in the summary the stand-in
wrote for it.

Requests that are not the agent's main loop are answered too: the agent's own
compaction request (its summarisation prompt: answered with a summary) and side requests
that do not offer the scenario's tool (titles, quota probes, small-model calls: a short
text, or the smallest JSON that fits the schema the request asks for). Every request's
kind is recorded, so a test can assert, e.g., that the agent never compacted by itself.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.tokens import TokenCounter
from proxy.testing.prompt import READ_RESULT, Prompt, Result, stub_refs, texts
from proxy.testing.reply import Call, Reply, counted
from proxy.testing.script import trim_to

# What the stand-in answers, by the kind of request (recorded as RecordedRequest.kind).
TOOL = "tool"  # a step calling the client tool
READ = "read"  # a read_result call before a step's action
TEXT = "text"  # a step answering with text (the last one ends the session)
SIDE = "side"  # a request that does not offer the scenario's tool
COMPACTION = "compaction"  # the agent asks for a summary of its own history

# Claude Code's summarisation prompt (2.1.x), the last user message of its compaction
# request, and the first words of the history it continues with afterwards; Gemini CLI's
# (0.61) last user message when it compresses its history.
COMPACTION_PROMPTS = (
    "Your task is to create a detailed summary of",
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",
    "Then, generate the updated <state_snapshot>.",
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


def is_compaction_request(prompt: Prompt) -> bool:
    """The agent asks for a summary of its own history (Claude Code's wording)."""
    last_user = next((e for e in reversed(prompt.entries) if e.role == "user"), None)
    if last_user is None:
        return False
    text = "\n".join(texts(last_user))
    return any(asked in text for asked in COMPACTION_PROMPTS)


def continues_after_compaction(prompt: Prompt) -> bool:
    """The history starts over from a summary the agent made by itself."""
    return any(CONTINUATION in text for entry in prompt.entries for text in texts(entry))


def cleared_results(prompt: Prompt) -> int:
    """Tool results the agent replaced by its own "cleared" marker."""
    return sum(
        any(CLEARED in text for text in part.texts)
        for entry in prompt.entries
        for part in entry.parts
        if isinstance(part, Result)
    )


@dataclass(frozen=True)
class Progress:
    done: int  # the last step whose tool call was answered (-1: none yet)
    reads: int  # read_result calls made since that answer


def progress(prompt: Prompt) -> Progress:
    """Where the session is, from the history alone."""
    names: dict[str, str] = {}
    done, reads, found = -1, 0, False
    for entry in prompt.entries:
        for part in entry.parts:
            if isinstance(part, Call):
                names[str(part.id)] = part.name
                if part.name == READ_RESULT:
                    reads += 1
            elif isinstance(part, Result):
                if names.get(part.call_id) == READ_RESULT:
                    continue
                step = STEP_ID.match(part.call_id)
                if step:
                    done, reads, found = int(step.group(1)), 0, True
    if not found:  # a history the agent compacted: the summary names the step
        notes = [
            int(n)
            for entry in prompt.entries
            for text in texts(entry)
            for n in STEP_NOTE.findall(text)
        ]
        if notes:
            done = notes[-1]
    return Progress(done, reads)


@dataclass(frozen=True)
class Choice:
    """What the scenario answers a request with: its kind, text and calls (their ids are
    prefixes: the request's hash completes them)."""

    kind: str
    text: str | None = None
    calls: tuple[Call, ...] = ()


def choose(scenario: Scenario, prompt: Prompt) -> Choice:
    """The kind of the request and the answer to it; deterministic in the prompt."""
    where = progress(prompt)
    if is_compaction_request(prompt):
        summary = (
            "<analysis>The session ran a scripted sequence of shell commands.</analysis>\n"
            f"<summary>Shell commands were run step by step. [scenario: step {where.done} done]"
            "</summary>"
        )
        return Choice(COMPACTION, summary)
    if scenario.tool_name not in prompt.tools:
        if prompt.schema is not None:  # e.g. Claude Code's session title: {"title": ...}
            return Choice(SIDE, orjson.dumps(_fill(prompt.schema, scenario.side_text)).decode())
        return Choice(SIDE, scenario.side_text)
    index = where.done + 1
    if index >= len(scenario.steps):
        return Choice(TEXT, scenario.done_text)
    step = scenario.steps[index]
    refs = stub_refs(prompt) if READ_RESULT in prompt.tools else []
    if where.reads < step.reads and refs:
        ref = refs[-1 - where.reads % len(refs)]  # newest stubs first
        read = {"ref": ref, "start": 0, "length": step.read_length}
        return Choice(READ, None, (Call(READ_RESULT, read, f"toolu_step{index:03d}_r"),))
    if not step.calls:
        return Choice(TEXT, step.text or scenario.done_text)
    calls = tuple(
        Call(call["name"], dict(call.get("input", {})), f"toolu_step{index:03d}_{k}")
        for k, call in enumerate(step.calls)
    )
    return Choice(TOOL, step.text, calls)


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
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)  # e.g. Gemini CLI's router: a score from 1
    return {"string": text, "array": [], "boolean": False}.get(str(kind), 0)


def scenario_reply(scenario: Scenario, prompt: Prompt, counter: TokenCounter, digest: str) -> Reply:
    """The stand-in's whole answer by the scenario: call ids end in the request's hash;
    text over the output limit is cut."""
    choice = choose(scenario, prompt)
    calls = tuple(dataclasses.replace(c, id=(str(c.id) + digest[24:])[:32]) for c in choice.calls)
    reply = Reply(digest, choice.text, calls, kind=choice.kind)
    text = choice.text
    if not calls and text and counter.count_text(text) > prompt.max_output:
        reply = dataclasses.replace(reply, text=trim_to(text, prompt.max_output, counter), cut=True)
    return counted(reply, counter)
