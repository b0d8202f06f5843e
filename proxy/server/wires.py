"""The wire formats the pipeline serves: what differs between them in the shell.

The pure planner gets a `Dialect`; the server's parts (the Compactor, the read_result
loop, the summariser, the error answers) get a `Wire`, which holds the format's pure
steps (a `Format`, proxy/wire/formats.py: the dialect, counting a request, picking the
read_result name, identifying the conversation; shared with the ops simulator) and the
shell's format-specific steps: calling the summariser, reading usage, and the round
merging of read_result. `ANTHROPIC_WIRE` is the Messages API, `CHAT_WIRE` OpenAI Chat.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import orjson

from proxy.core.dialect import Dialect
from proxy.core.identity import credential
from proxy.core.meter import openai_usage
from proxy.core.rewrite import NeedSummary
from proxy.core.sse import Event
from proxy.core.summary import INSTRUCTION
from proxy.core.tokens import TokenCounter
from proxy.server import charges, errors
from proxy.server.summariser import PURPOSE_HEADER, call_summariser
from proxy.wire import anthropic_rounds, openai_rounds
from proxy.wire import openai as chat
from proxy.wire.formats import ANTHROPIC_FORMAT, CHAT_FORMAT, Format

SummariserCall = Callable[..., Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Wire:
    format: Format  # the pure steps: counting, read_result's name, the identity view
    summarise: SummariserCall
    usage_input: Callable[[Mapping[str, Any]], dict[str, Any]]  # usage as calibration reads it
    # read_result rounds
    split: Callable[[dict[str, Any], str], Any]
    merge: Callable[[Sequence[dict[str, Any]], str], dict[str, Any]]
    continue_messages: Callable[[Sequence[Any], Any, Sequence[tuple[str, str, bool]]], list[Any]]
    merger: Callable[[str], Any]
    round_event: Callable[[Any, Event], str | None]  # "stop", "error" or None
    error_event: Callable[[Any, int], bytes]  # an upstream error body -> an in-stream error
    # the proxy's own errors
    invalid_request: Callable[[str], Any]
    refusal: Callable[[str], Any]

    @property
    def name(self) -> str:
        return self.format.name

    @property
    def dialect(self) -> Dialect:
        return self.format.dialect

    @property
    def counter(self) -> Callable[[TokenCounter], Any]:
        return self.format.counter

    @property
    def fixed_tokens(self) -> Callable[[Any, Mapping[str, Any]], int]:
        return self.format.fixed_tokens

    @property
    def tool_name(self) -> Callable[[Mapping[str, Any]], str | None]:
        return self.format.tool_name

    @property
    def identity_view(self) -> Callable[[Mapping[str, Any]], Mapping[str, Any]]:
        return self.format.identity_view


# -- Anthropic Messages ---------------------------------------------------------------------


def _anthropic_round_event(merger: Any, event: Event) -> str | None:
    if event.name == "error":
        return "error"
    return "stop" if event.name == "message_stop" else None


def _anthropic_error_event(payload: Any, status: int) -> bytes:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return errors.stream_error_event("api_error", f"upstream answered {status}")
    return errors.stream_error_event(str(error.get("type", "api_error")), str(error.get("message")))


ANTHROPIC_WIRE = Wire(
    format=ANTHROPIC_FORMAT,
    summarise=call_summariser,
    usage_input=dict,
    split=anthropic_rounds.split_message,
    merge=anthropic_rounds.merge_messages,
    continue_messages=anthropic_rounds.continue_messages,
    merger=anthropic_rounds.StreamMerger,
    round_event=_anthropic_round_event,
    error_event=_anthropic_error_event,
    invalid_request=errors.invalid_request,
    refusal=errors.invalid_request,
)


# -- OpenAI Chat Completions ----------------------------------------------------------------


async def call_chat_summariser(
    need: NeedSummary,
    *,
    model: str,
    headers: Mapping[str, str],
    base_url: str,
    seconds: float,
) -> str:
    """One Chat Completions call through the openai SDK, with the caller's credential
    (and its organization and project headers)."""
    extra = {PURPOSE_HEADER: "summary"}
    for name in ("OpenAI-Organization", "OpenAI-Project"):
        if headers.get(name):
            extra[name] = headers[name]
    client = openai.AsyncOpenAI(
        base_url=base_url.rstrip("/") + "/v1",
        api_key=credential(headers) or "none",
        max_retries=1,
        timeout=seconds,
        default_headers=extra,
    )
    async with client:
        completion = await client.chat.completions.create(
            model=need.model or model,
            max_completion_tokens=need.slot,
            messages=[
                {"role": "system", "content": INSTRUCTION},
                {"role": "user", "content": need.transcript},
            ],
        )
    if completion.usage is not None:  # the caller's budget pays
        charges.summariser_usage(openai_usage(completion.usage.model_dump()))
    if not completion.choices:
        return ""
    return completion.choices[0].message.content or ""


def _chat_round_event(merger: Any, event: Event) -> str | None:
    if merger.failed:
        return "error"
    return "stop" if merger.stopped else None


def _chat_error_event(payload: Any, status: int) -> bytes:
    error = payload.get("error") if isinstance(payload, dict) else None
    if not isinstance(error, dict):
        return chat.stream_error_event(f"upstream answered {status}", "api_error")
    return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


CHAT_WIRE = Wire(
    format=CHAT_FORMAT,
    summarise=call_chat_summariser,
    usage_input=chat.usage_as_input,
    split=openai_rounds.split_completion,
    merge=openai_rounds.merge_completions,
    continue_messages=openai_rounds.continue_messages,
    merger=openai_rounds.ChatStreamMerger,
    round_event=_chat_round_event,
    error_event=_chat_error_event,
    invalid_request=lambda message: errors.openai_error(400, message, "invalid_request_error"),
    refusal=lambda message: errors.openai_error(
        400, message, "invalid_request_error", code="context_length_exceeded", param="messages"
    ),
)
