"""What the upstream reported it used, read from the answer's bytes as they pass.

A meter sees every upstream answer of one client request: relayed or intercepted, whole
bodies or SSE chunks cut anywhere, several rounds (read_result) and summariser calls. Each
answer is a *round* with its own usage. In a stream, `message_start` opens a round with
the input counts and `message_delta` carries the cumulative output; a round that never
got its `message_delta` was cut (a disconnect, a broken upstream), and its output is
estimated from the text deltas that did arrive.

Only whole lines are looked at, and a line is only parsed when it is a `message_start` /
`message_delta` event's data (or an OpenAI chunk with usage): the text deltas in between
cost a prefix check each.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.budget import Amounts, usage_cost

_START = b'data: {"type":"message_start"'
_DELTA = b'data: {"type":"message_delta"'
_TEXT = b'data: {"type":"content_block_delta"'
_OPENAI_USAGE = b'"usage":{"prompt_tokens"'
_LOOK = 48  # bytes of a line enough to tell whether it matters
_DELTA_OVERHEAD = 72  # bytes of JSON around a delta's text
_CHARS_PER_TOKEN = 3  # a cut round's output estimate errs high (text runs ~4)


@dataclass(slots=True)
class _Round:
    usage: dict[str, Any] = field(default_factory=dict)
    finished: bool = False  # its final usage arrived
    delta_chars: int = 0  # text seen, for a cut round's estimate


def openai_usage(usage: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI usage mapped onto Anthropic's fields (cached prompt tokens as reads)."""
    prompt = usage.get("prompt_tokens") or 0
    details = usage.get("prompt_tokens_details")
    cached = (details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
    return {
        "input_tokens": max(0, prompt - cached),
        "cache_read_input_tokens": cached,
        "output_tokens": usage.get("completion_tokens") or 0,
    }


class UsageMeter:
    def __init__(self) -> None:
        self.rounds: list[_Round] = []
        self.extra: list[dict[str, Any]] = []  # summariser calls made for this request
        self.seen_answer = False  # some 200 answer's bytes went through
        self._carry = b""
        self._skipping = False  # inside a long line that does not matter

    # -- feeding -------------------------------------------------------------------------

    def body(self, raw: bytes) -> None:
        """A whole JSON answer (one round)."""
        self.seen_answer = True
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        usage = message.get("usage") if isinstance(message, dict) else None
        if isinstance(usage, dict):
            if "prompt_tokens" in usage:
                usage = openai_usage(usage)
            self.rounds.append(_Round(dict(usage), finished=True))

    def chunk(self, data: bytes) -> None:
        """Bytes of an SSE answer, cut anywhere."""
        self.seen_answer = True
        if self._carry:
            data = self._carry + data
            self._carry = b""
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            if self._skipping:
                self._skipping = False
            else:
                self._line(data[start:end])
            start = end + 1
        if self._skipping:
            return
        rest = data[start:]
        if len(rest) > _LOOK and not self._matters(rest):
            self._skipping = True
            self._count_text(rest)
        else:
            self._carry = rest

    def summariser(self, usage: Mapping[str, Any]) -> None:
        self.extra.append(dict(usage))

    @staticmethod
    def _matters(line: bytes) -> bool:
        return line.startswith((_START, _DELTA)) or (
            line.startswith(b"data: {") and not line.startswith(_TEXT)
        )

    def _count_text(self, line: bytes) -> None:
        if line.startswith(_TEXT) and self.rounds:
            self.rounds[-1].delta_chars += max(0, len(line) - _DELTA_OVERHEAD)

    def _line(self, line: bytes) -> None:
        if line.startswith(_TEXT):
            self._count_text(line)
        elif line.startswith(_START):
            message = _data(line).get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            self.rounds.append(_Round(dict(usage) if isinstance(usage, dict) else {}))
        elif line.startswith(_DELTA):
            usage = _data(line).get("usage")
            if isinstance(usage, dict):
                if not self.rounds:
                    self.rounds.append(_Round())
                self.rounds[-1].usage.update(usage)
                self.rounds[-1].finished = True
        elif _OPENAI_USAGE in line and line.startswith(b"data: {"):
            usage = _data(line).get("usage")
            if isinstance(usage, dict):
                self.rounds.append(_Round(openai_usage(usage), finished=True))

    # -- reading -------------------------------------------------------------------------

    def cost(self, reserved: Amounts) -> Amounts:
        """What this request used. A cut round's output is estimated from its text,
        capped at the reserved output; an answer that went through with no usage at all
        costs its whole reservation (nothing better is known)."""
        total = reserved if self.seen_answer and not self.rounds else Amounts()
        for round_ in self.rounds:
            amounts = usage_cost(round_.usage)
            if not round_.finished:
                guess = -(-round_.delta_chars // _CHARS_PER_TOKEN)
                output = min(max(amounts.output, guess), max(reserved.output, amounts.output))
                amounts = Amounts(amounts.input, output, amounts.weighted)
            total = total.plus(amounts)
        for usage in self.extra:
            total = total.plus(usage_cost(usage))
        return total


def _data(line: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(line[5:])
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}
