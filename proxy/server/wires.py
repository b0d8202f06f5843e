"""The wire formats the pipeline serves: what differs between them in the shell.

The pure planner gets a `Dialect`; the server's parts (the Compactor, the read_result
loop, the summariser, the error answers) get a `Wire`, which holds that dialect and the
few format-specific steps around it: counting a request, picking the read_result name,
identifying the conversation, calling the summariser, reading usage, and the round
merging of read_result. `ANTHROPIC_WIRE` is the Messages API, `CHAT_WIRE` OpenAI Chat.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
import orjson

from proxy.core.dialect import Dialect
from proxy.core.identity import credential
from proxy.core.meter import openai_usage
from proxy.core.offload import choose_tool_name
from proxy.core.rewrite import NeedSummary
from proxy.core.sse import Event
from proxy.core.summary import INSTRUCTION
from proxy.core.tokens import TokenCounter
from proxy.server import charges, errors
from proxy.server.summariser import PURPOSE_HEADER, call_summariser
from proxy.wire import anthropic_rounds, openai_rounds
from proxy.wire import openai as chat
from proxy.wire.anthropic import ANTHROPIC

SummariserCall = Callable[..., Awaitable[str]]


@dataclass(frozen=True, slots=True)
class Wire:
    name: str
    dialect: Dialect
    counter: Callable[[TokenCounter], Any]  # the counter for this format's messages
    fixed_tokens: Callable[[Any, Mapping[str, Any]], int]  # system prompt + tools
    tool_name: Callable[[Mapping[str, Any]], str | None]  # read_result's name; None: off
    identity_view: Callable[[Mapping[str, Any]], Mapping[str, Any]]  # for conversation_of
    summarise: SummariserCall
    usage_input: Callable[[Mapping[str, Any]], dict[str, Any]]  # usage as calibration reads it
    usage_field: re.Pattern[bytes]  # input counts in relayed bytes
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


# -- Anthropic Messages ---------------------------------------------------------------------


def _anthropic_fixed(counter: Any, body: Mapping[str, Any]) -> int:
    return int(counter.count_system(body.get("system")) + counter.count_tools(body.get("tools")))


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
    name="anthropic",
    dialect=ANTHROPIC,
    counter=lambda base: base,
    fixed_tokens=_anthropic_fixed,
    tool_name=lambda body: choose_tool_name(body.get("tools")),
    identity_view=lambda body: body,
    summarise=call_summariser,
    usage_input=dict,
    usage_field=re.compile(
        rb'"(input_tokens|cache_creation_input_tokens|cache_read_input_tokens)"\s*:\s*(\d+)'
    ),
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


def _chat_tool_name(body: Mapping[str, Any]) -> str | None:
    n = body.get("n")
    if n not in (None, 1):
        return None  # several choices: the rounds follow one, so offload stays off
    return chat.choose_tool_name(body.get("tools"))


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
    name="openai",
    dialect=chat.OPENAI,
    counter=chat.ChatCounter,
    fixed_tokens=lambda counter, body: int(counter.count_tools(body.get("tools"))),
    tool_name=_chat_tool_name,
    identity_view=chat.identity_view,
    summarise=call_chat_summariser,
    usage_input=chat.usage_as_input,
    usage_field=re.compile(rb'"(prompt_tokens)"\s*:\s*(\d+)'),
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
