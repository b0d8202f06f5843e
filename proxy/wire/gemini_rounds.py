"""read_result rounds on the Gemini API, sans I/O (the `Rounds` of proxy/core/wire_format.py).

When the model calls the injected `read_result` function, the proxy answers it and asks
again; the client sees one answer, whole or streamed, with no read_result call in it:

- `split_answer` reads one upstream answer as a `Round`; `merge_answers` makes one
  client answer of several; `continue_contents` appends a round's model turn and the
  function responses the proxy gives it (by position, as the API pairs them).
- `GeminiStreamMerger` does the same for streamed rounds (`data:` chunks, each a whole
  GenerateContentResponse holding the next parts): read_result calls are held back, the
  rest goes out as it comes, and the chunk carrying a round's finishReason is held until
  the round ends, so that one final chunk ends the client's answer. With one round and
  nothing held, every chunk goes out as the very bytes that came in.

Thought signatures: Gemini 3 puts a turn's signature on its first function call and
refuses a function-call turn whose first call lost it; a client that finds none inserts
a dummy one. So when the proxy removes its read_result call and the model made client
calls beside it, the removed call's signature goes onto the first call the client keeps
(unless that one carries its own). Thought parts and every other signature pass as given.

Usage (`client_usage`): the prompt of the LAST round (what the model saw last; clients
size their context from it) and the output the client received (every round's
candidates, less the read_result calls it never saw, and every round's thoughts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from proxy.core.sse import Event
from proxy.core.usage import Usage, call_tokens, count
from proxy.core.wire_format import MergeState, ReadCall, Round
from proxy.wire.common import RoundsMerger
from proxy.wire.gemini_parts import call_key, field, signature_of

ROUND_SEPARATOR = "\n\n"  # between the text of two rounds, so sentences do not run on
SIGNATURE = "thoughtSignature"
STOP = "STOP"


def gemini_usage(raw: Mapping[str, Any]) -> Usage:
    """usageMetadata in the core's terms: promptTokenCount counts every input token (the
    cached ones, cachedContentTokenCount, included; tool-use prompts apart); the output
    is the candidates and the thinking."""
    prompt = count(raw.get("promptTokenCount")) + count(raw.get("toolUsePromptTokenCount"))
    cached = min(count(raw.get("cachedContentTokenCount")), prompt)
    output = count(raw.get("candidatesTokenCount")) + count(raw.get("thoughtsTokenCount"))
    return Usage(input_tokens=prompt - cached, cache_read_input_tokens=cached, output_tokens=output)


def client_usage(rounds: Sequence[object], held_tokens: int) -> dict[str, Any]:
    """The last round's usageMetadata, with the candidates of every round less
    `held_tokens`, the thoughts of every round, and the total made of them."""
    usages = [u for u in rounds if isinstance(u, dict)]
    if not usages:
        return {}
    out = dict(usages[-1])
    candidates = max(0, sum(count(u.get("candidatesTokenCount")) for u in usages) - held_tokens)
    thoughts = sum(count(u.get("thoughtsTokenCount")) for u in usages)
    out["candidatesTokenCount"] = candidates
    if thoughts or "thoughtsTokenCount" in out:
        out["thoughtsTokenCount"] = thoughts
    prompt = count(out.get("promptTokenCount")) + count(out.get("toolUsePromptTokenCount"))
    out["totalTokenCount"] = prompt + candidates + thoughts
    return out


def note_part(note: str, said: bool) -> dict[str, Any]:
    """The text part the proxy ends an answer with (why the rounds stopped), apart from
    the text before it when the client was told some."""
    return {"text": ROUND_SEPARATOR + note if said else note}


def first_candidate(answer: Mapping[str, Any]) -> dict[str, Any]:
    candidates = answer.get("candidates")
    if isinstance(candidates, list) and candidates and isinstance(candidates[0], dict):
        return candidates[0]
    return {}


def candidate_parts(candidate: Mapping[str, Any]) -> list[dict[str, Any]]:
    content = candidate.get("content")
    parts = content.get("parts") if isinstance(content, dict) else None
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


def _call(part: Mapping[str, Any]) -> dict[str, Any] | None:
    call = field(part, "functionCall")
    return call if isinstance(call, dict) else None


def _held_tokens(call: Mapping[str, Any]) -> int:
    return call_tokens(len(orjson.dumps(call.get("args", {}))))


def _plain_text(part: Mapping[str, Any]) -> bool:
    """A text part of the answer (not a thought), into which a separator may go."""
    return isinstance(field(part, "text"), str) and part.get("thought") is not True


class _Filter:
    """One round's parts on their way to the client: read_result calls held (their
    signature carried to the next call the client keeps), the others numbered in order."""

    def __init__(self, tool: str) -> None:
        self.tool = tool
        self.calls = 0  # function calls seen this round (their positions)
        self.reads: list[ReadCall] = []
        self.client_calls = 0
        self.held_tokens = 0
        self.signature: str | None = None  # from a held call, for the next kept call

    def keep(self, part: dict[str, Any]) -> dict[str, Any] | None:
        """The part as the client gets it, or None when it is held."""
        call = _call(part)
        if call is None:
            return part
        position = self.calls
        self.calls += 1
        if call.get("name") == self.tool:
            self.reads.append(ReadCall(call_key(position), call.get("args", {})))
            self.held_tokens += _held_tokens(call)
            self.signature = self.signature or signature_of(part)
            return None
        self.client_calls += 1
        if self.signature is not None:
            carried, self.signature = self.signature, None
            if signature_of(part) is None:
                return {**part, SIGNATURE: carried}
        return part


def aggregate(parts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Streamed parts as one turn: consecutive text pieces of the same kind (thought or
    not) joined, a signature staying with the piece it came on or the join it ends."""
    out: list[dict[str, Any]] = []
    for part in parts:
        last = out[-1] if out else None
        if (
            last is not None
            and set(last) <= {"text", "thought"}
            and set(part) <= {"text", "thought", SIGNATURE}
            and isinstance(last.get("text"), str)
            and isinstance(part.get("text"), str)
            and last.get("thought") is part.get("thought")
        ):
            out[-1] = {**last, **part, "text": last["text"] + part["text"]}
        elif set(part) == {"text"} and part["text"] == "":
            continue  # an empty piece carries nothing
        else:
            out.append(dict(part))
    return out


# -- non-streaming ------------------------------------------------------------------------


def split_answer(answer: dict[str, Any], tool: str) -> Round:
    candidate = first_candidate(answer)
    parts = candidate_parts(candidate)
    kept = _Filter(tool)
    for part in parts:
        kept.keep(part)
    content = candidate.get("content")
    assistant = dict(content) if isinstance(content, dict) else {"role": "model", "parts": []}
    assistant.setdefault("role", "model")
    usage = answer.get("usageMetadata")
    reason = candidate.get("finishReason")
    return Round(
        assistant=assistant,
        reads=kept.reads,
        client_calls=kept.client_calls,
        stop_reason=reason if isinstance(reason, str) else None,
        usage=gemini_usage(usage if isinstance(usage, dict) else {}),
        asks_to_read=reason == STOP,
    )


def merge_answers(
    answers: Sequence[dict[str, Any]], tool: str, note: str | None = None
) -> dict[str, Any]:
    """One answer for the client from every round's: read_result calls removed (their
    signatures carried), the texts of rounds apart, the last round's finishReason, the
    usage the client can act on; `note` ends it with a short text of the proxy's."""
    first, last = answers[0], answers[-1]
    parts: list[dict[str, Any]] = []
    held = 0
    said = False  # some text went before: the next round's starts apart
    for answer in answers:
        kept = _Filter(tool)
        separated = False
        for part in candidate_parts(first_candidate(answer)):
            out = kept.keep(part)
            if out is None:
                continue
            if _plain_text(out) and out["text"]:
                if said and not separated:
                    out = {**out, "text": ROUND_SEPARATOR + out["text"]}
                separated = said = True
            parts.append(out)
        held += kept.held_tokens
    if note is not None:
        parts.append(note_part(note, said))
    candidate = dict(first_candidate(first))
    content = candidate.get("content")
    candidate["content"] = {"role": "model", **(content if isinstance(content, dict) else {})}
    candidate["content"]["parts"] = parts
    reason = first_candidate(last).get("finishReason")
    if reason is not None:
        candidate["finishReason"] = reason
    merged: dict[str, Any] = {**first, "candidates": [candidate]}
    if any(isinstance(a.get("usageMetadata"), dict) for a in answers):
        merged["usageMetadata"] = client_usage([a.get("usageMetadata") for a in answers], held)
    return merged


def continue_contents(
    contents: Sequence[Any], round_: Round, results: Sequence[tuple[str, str, bool]]
) -> list[Any]:
    """The request's contents plus the round's model turn and a user turn answering each
    of its calls in order (the proxy continues only a round that called read_result
    alone): `{"output": ...}`, or `{"error": ...}` for a read it could not do."""
    calls = [c for p in round_.assistant.get("parts") or () if (c := _call(p)) is not None]
    given = {call_id: (text, error) for call_id, text, error in results}
    parts = []
    for position, call in enumerate(calls):
        text, error = given.get(call_key(position), ("", True))
        response: dict[str, Any] = {"name": call.get("name")}
        if call.get("id") is not None:
            response["id"] = call["id"]
        response["response"] = {"error" if error else "output": text}
        parts.append({"functionResponse": response})
    return [*contents, round_.assistant, {"role": "user", "parts": parts}]


# -- streaming ----------------------------------------------------------------------------


def sse_chunk(data: Mapping[str, Any]) -> bytes:
    """One chunk as the API frames it on `alt=sse`."""
    return b"data: " + orjson.dumps(data) + b"\r\n\r\n"


class GeminiStreamMerger(RoundsMerger):
    """Several streamed rounds, one client answer (RoundMerger). `frame` writes a chunk
    the merger made (SSE by default; the JSON array form's transport passes its own);
    an unchanged chunk goes out as its event's raw bytes."""

    def __init__(self, tool: str, frame: Callable[[Mapping[str, Any]], bytes] = sse_chunk) -> None:
        super().__init__(tool)
        self._frame = frame
        self._usages: list[dict[str, Any]] = []  # every finished round's usage, as given
        self._said = False  # text reached the client
        self._pending: list[bytes] = []  # an earlier round's last parts, not sent yet
        self._reset()

    def begin_round(self) -> None:
        self.next_round()
        self._reset()

    def _reset(self) -> None:
        self._filter = _Filter(self.tool)
        self._parts: list[dict[str, Any]] = []
        self._finish: tuple[dict[str, Any], bytes, list[dict[str, Any]]] | None = None
        self._raw_usage: dict[str, Any] = {}
        self._separated = False

    def feed(self, event: Event) -> list[bytes]:
        """The bytes to send the client for one upstream event (often the event itself)."""
        out, self._pending = self._pending, []
        text = event.data.strip()
        if event.name == "" or not text:
            return [*out, event.raw]
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return [*out, event.raw]
        if not isinstance(data, dict):
            return [*out, event.raw]
        if "error" in data:
            self.state = MergeState.FAILED
            return [*out, event.raw]
        usage = data.get("usageMetadata")
        if isinstance(usage, dict):
            self._raw_usage = usage
        candidate = first_candidate(data)
        if not candidate:
            feedback = data.get("promptFeedback")
            if isinstance(feedback, dict) and feedback.get("blockReason"):
                # A refused prompt: the answer ends here, with no candidate at all.
                self.round.stop_reason = str(feedback["blockReason"])
                self.state = MergeState.STOPPED
            return [*out, event.raw]
        parts = candidate_parts(candidate)
        self._parts.extend(parts)
        kept, changed = self._kept(parts)
        reason = candidate.get("finishReason")
        if reason is not None:
            # Held until the round ends: only the last round's ending reaches the client.
            self.round.stop_reason = str(reason)
            self.state = MergeState.STOPPED
            self._finish = (data, event.raw, kept)
            return out
        if not changed:
            return [*out, event.raw]
        if not kept:
            return out
        return [*out, self._frame(_with_parts(data, kept))]

    def _kept(self, parts: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
        kept: list[dict[str, Any]] = []
        changed = False
        for part in parts:
            out = self._filter.keep(part)
            if out is None:
                changed = self.held_any = True
                continue
            if _plain_text(out) and out["text"]:
                if self._said and not self._separated and self.rounds > 1:
                    out = {**out, "text": ROUND_SEPARATOR + out["text"]}
                self._separated = self._said = True
            changed = changed or out is not part
            kept.append(out)
        return kept, changed

    def end_round(self) -> Round:
        """The round just finished (after its last chunk, or after the stream ended)."""
        round_ = self.round
        kept = self._filter
        round_.reads = kept.reads
        round_.client_calls = kept.client_calls
        self.held_tokens += kept.held_tokens
        round_.assistant = {"role": "model", "parts": aggregate(self._parts)}
        round_.usage = gemini_usage(self._raw_usage)
        round_.asks_to_read = round_.stop_reason == STOP
        if self._raw_usage:
            self._usages.append(dict(self._raw_usage))
        if self._finish is not None and round_.wants_reads_only:
            # Another round follows: what this one's last chunk kept goes out now.
            data, _, parts = self._finish
            if parts:
                self._pending.append(self._frame(_with_parts(data, parts, ending=False)))
            self._finish = None
        return round_

    def finish(self, note: str | None = None) -> list[bytes]:
        """The closing chunk: the upstream's own when one round held nothing back.
        `note`: a short text the proxy ends the answer with (why the rounds stopped)."""
        out, self._pending = self._pending, []
        if self.ends_as_upstream(note):
            return [*out, self._finish[1]] if self._finish is not None else out
        data, parts = ({}, []) if self._finish is None else (self._finish[0], self._finish[2])
        if note is not None:
            parts = [*parts, note_part(note, self._said)]
        final = _with_parts(data, parts, ending=True)
        candidate = final["candidates"][0]
        candidate.setdefault("finishReason", self.round.stop_reason or STOP)
        usage = client_usage(self._usages, self.held_tokens)
        if usage:
            final["usageMetadata"] = usage
        return [*out, self._frame(final)]


def _with_parts(
    data: Mapping[str, Any], parts: list[dict[str, Any]], *, ending: bool = False
) -> dict[str, Any]:
    """A chunk like `data` holding `parts`; not `ending`: without its finishReason and
    usage (they come once, at the end)."""
    candidate = dict(first_candidate(data)) or {"index": 0}
    content = candidate.get("content")
    candidate["content"] = {"role": "model", **(content if isinstance(content, dict) else {})}
    candidate["content"]["parts"] = parts
    out = {**data, "candidates": [candidate]}
    if not ending:
        candidate.pop("finishReason", None)
        out.pop("usageMetadata", None)
    return out


class GeminiRounds:
    """The Gemini format's `Rounds` (proxy/core/wire_format.py): this module's functions."""

    split = staticmethod(split_answer)
    merge = staticmethod(merge_answers)
    continue_messages = staticmethod(continue_contents)

    def merger(self, tool: str) -> GeminiStreamMerger:
        return GeminiStreamMerger(tool)
