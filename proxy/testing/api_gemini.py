"""The stand-in's Gemini API (Google AI Studio's `generativelanguage.googleapis.com`).

Routes, under `/v1beta` and `/v1`: `POST models/{model}:generateContent` (one JSON
answer), `:streamGenerateContent` (`?alt=sse`: `data:` chunks, each a whole
GenerateContentResponse holding the next parts; without it the JSON array form, one
element a chunk), `:countTokens` (`contents`, or a whole `generateContentRequest`), and
`GET models` (pages of `pageSize`) and `GET models/{model}`.

As strict as the API: the key in `x-goog-api-key` or `?key=` (else 403
PERMISSION_DENIED); a model it does not serve is 404 NOT_FOUND; bodies are checked by
the rules the proxy shares (proxy/wire/gemini_validation.py), and on a Gemini 3 model a
function call turn of the current turn must carry a signature this stand-in issued (or
the documented `skip_thought_signature_validator`). Errors are
`{"error": {"code", "message", "status"}}`; a 429 says when to come back in a RetryInfo
detail, as Google's do.

Answers: thought summaries (`thought: true`, when `thinkingConfig.includeThoughts` and
the script says `thinking`), the text, then the function calls, the first carrying the
turn's `thoughtSignature`. The API sends no call ids; the signature (opaque, returned
byte for byte) holds the ids the script gave its calls, so the stand-in reads them back
from a history. Usage: `promptTokenCount` (every input token), `cachedContentTokenCount`
from implicit caching (a repeated prefix, every content boundary: cache.py),
`candidatesTokenCount`, `thoughtsTokenCount`. Streamed, every chunk carries the prompt's
usage and the last one the finishReason and the whole usage.
"""

from __future__ import annotations

import base64
import binascii
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import TokenCounter
from proxy.testing.answering import Checked, count_tokens, serve
from proxy.testing.api import Api, Event, Refusal, event, text_pieces
from proxy.testing.cache import Unit, prefix_units
from proxy.testing.prompt import Entry, Part, Prompt, Result, Text
from proxy.testing.reply import Call, Reply, Stop, Usage
from proxy.testing.standin_http import (
    COUNTER,
    OPTIONS,
    RECORD,
    Framing,
)
from proxy.wire.gemini import error_payload, status_name
from proxy.wire.gemini_parts import (
    GeminiCounter,
    field,
    function_calls,
    parts_of,
    response_text,
    role_of,
    signature_of,
)
from proxy.wire.gemini_validation import (
    Violation,
    check_request,
    checks_signatures,
    current_turn,
    structure_violation,
)

# (id, display name, input limit): the models the CLI and the SDK name.
MODELS = (
    ("gemini-2.5-pro", "Gemini 2.5 Pro", 1_048_576),
    ("gemini-2.5-flash", "Gemini 2.5 Flash", 1_048_576),
    ("gemini-2.5-flash-lite", "Gemini 2.5 Flash-Lite", 1_048_576),
    ("gemini-3-pro-preview", "Gemini 3 Pro Preview", 1_048_576),
    ("gemini-3-flash-preview", "Gemini 3 Flash Preview", 1_048_576),
    ("gemini-3.1-pro-preview", "Gemini 3.1 Pro Preview", 1_048_576),
    ("gemini-3.1-pro-preview-customtools", "Gemini 3.1 Pro Preview (custom tools)", 1_048_576),
    ("gemini-3.1-flash-lite", "Gemini 3.1 Flash-Lite", 1_048_576),
    ("gemini-3.1-flash-lite-preview", "Gemini 3.1 Flash-Lite Preview", 1_048_576),
    ("gemini-3.5-flash", "Gemini 3.5 Flash", 1_048_576),
    ("gemini-3.5-flash-lite", "Gemini 3.5 Flash-Lite", 1_048_576),
)
MODEL_IDS = frozenset(m[0] for m in MODELS)
OUTPUT_LIMIT = 65_536
GENERATION_METHODS = (
    "generateContent",
    "countTokens",
    "createCachedContent",
    "batchGenerateContent",
)
FINISH_REASONS = {Stop.END: "STOP", Stop.TOOL: "STOP", Stop.LENGTH: "MAX_TOKENS"}
# What the docs let a client send in place of a signature it does not have.
DUMMY_SIGNATURES = frozenset(
    {"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"}
)
SIGNATURE_PREFIX = b"standin-signature:"

UNREGISTERED = (
    "Method doesn't allow unregistered callers (callers without established identity)."
    " Please use API Key or other form of API consumer identity to call this API."
)
FAULTS = {
    "429": Refusal(
        429,
        "RESOURCE_EXHAUSTED",
        "You exceeded your current quota, please check your plan and billing details.",
    ),
    "529": Refusal(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
    "500": Refusal(500, "INTERNAL", "An internal error has occurred. Please retry."),
}
STREAM_ERROR = event("end", None, error_payload(503, FAULTS["529"].message))


def api_key(request: web.Request) -> str | None:
    """The key, as the API takes it: the header, or the `key` query parameter."""
    key = request.headers.get("x-goog-api-key", "").strip() or request.query.get("key", "")
    return key.strip() or None


def google_error(refusal: Refusal) -> web.Response:
    """A refusal in Google's shape: the status named as google.rpc names it; a wait as
    RetryInfo (Google sends no Retry-After header)."""
    wait = refusal.headers.get("retry-after")
    payload = error_payload(
        refusal.status, refusal.message, retry_after=int(wait) if wait else None
    )
    if refusal.kind.isupper():
        payload["error"]["status"] = refusal.kind
    return web.Response(
        status=refusal.status, body=orjson.dumps(payload), content_type="application/json"
    )


def refusal_of(violation: Violation) -> Refusal:
    return Refusal(violation.status, status_name(violation.status), violation.message)


# -- call ids in signatures ----------------------------------------------------------------


def signature(ids: list[str]) -> str:
    """A turn's thought signature: opaque to the client, the calls' ids to the stand-in."""
    return base64.b64encode(SIGNATURE_PREFIX + orjson.dumps(ids)).decode()


def _decoded(value: str) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None


def dummy_signature(value: str) -> bool:
    """The documented stand-in value, as sent (a JSON string) or base64 (an SDK's bytes)."""
    return (
        value in DUMMY_SIGNATURES or (_decoded(value) or b"").decode("latin-1") in DUMMY_SIGNATURES
    )


def signed_ids(value: str | None) -> list[str] | None:
    """The call ids a signature of this stand-in holds (None: not one of its own)."""
    raw = _decoded(value) if value is not None else None
    if raw is None or not raw.startswith(SIGNATURE_PREFIX):
        return None
    try:
        ids = orjson.loads(raw[len(SIGNATURE_PREFIX) :])
    except orjson.JSONDecodeError:
        return None
    return [str(i) for i in ids] if isinstance(ids, list) else None


def _forged_signature(contents: list[Any]) -> Refusal | None:
    """A function call turn of the current turn whose signature is not one the stand-in
    issued (a proxy that moved, cut or made one up)."""
    for i in range(current_turn(contents), len(contents)):
        calls = function_calls(contents[i]) if role_of(contents[i]) == "model" else []
        given = signature_of(calls[0]) if calls else None
        if given is None or dummy_signature(given) or signed_ids(given) is not None:
            continue
        return Refusal(
            400,
            "INVALID_ARGUMENT",
            f"Unable to submit request because the thought signature of contents[{i}] is"
            " not valid.",
        )
    return None


# -- the reader ------------------------------------------------------------------------------


def _call_ids(content: Mapping[str, Any], index: int) -> list[str]:
    """The ids of a model turn's calls: those its signature holds, else by position."""
    calls = function_calls(content)
    given = signed_ids(signature_of(calls[0])) if calls else None
    return [
        given[k] if given is not None and k < len(given) else f"gemini_{index}_{k}"
        for k in range(len(calls))
    ]


def _entries(contents: list[Any]) -> Iterator[Entry]:
    previous: list[str] = []  # the ids of the calls the next user turn answers
    for index, content in enumerate(contents):
        model = role_of(content) == "model"
        ids = _call_ids(content, index) if model else []
        parts: list[Part] = []
        calls = answers = 0
        for part in parts_of(content):
            if part.get("thought") is True:
                continue
            text = field(part, "text")
            call = field(part, "functionCall")
            response = field(part, "functionResponse")
            if isinstance(text, str):
                parts.append(Text(text))
            elif isinstance(call, dict):
                parts.append(Call(str(call.get("name")), call.get("args", {}), ids[calls]))
                calls += 1
            elif isinstance(response, dict):
                known = answers < len(previous)
                call_id = previous[answers] if known else f"gemini_answer_{index}_{answers}"
                text = response_text(response)
                parts.append(Result(call_id, (text,) if text is not None else ()))
                answers += 1
        previous = ids
        yield Entry("assistant" if model else "user", tuple(parts))


def _lower_types(schema: Any) -> Any:
    """An OpenAPI-style schema (`"type": "OBJECT"`) as JSON Schema spells it."""
    if isinstance(schema, list):
        return [_lower_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _lower_types(v) for k, v in schema.items()}
    if isinstance(out.get("type"), str):
        out["type"] = out["type"].lower()
    return out


def read(body: Mapping[str, Any]) -> Prompt:
    """A generateContent body as the script reads it: a model turn is the assistant's."""
    contents = body.get("contents") or []
    tools = tuple(
        str(d.get("name"))
        for tool in body.get("tools") or ()
        for d in field(tool, "functionDeclarations") or ()
        if isinstance(d, dict)
    )
    config = field(body, "generationConfig") or {}
    limit = field(config, "maxOutputTokens")
    thinking = field(config, "thinkingConfig")
    shows_thoughts = isinstance(thinking, dict) and field(thinking, "includeThoughts") is True
    mime = field(config, "responseMimeType")
    schema = field(config, "responseJsonSchema") or field(config, "responseSchema")
    json_answer = isinstance(mime, str) and mime.startswith("application/json")
    return Prompt(
        functools.partial(_entries, contents),
        len(contents),
        tools,
        limit or OUTPUT_LIMIT,
        limit or 1024,
        shows_thoughts,
        schema=_lower_types(schema) if json_answer and isinstance(schema, dict) else None,
    )


# -- the renderer -----------------------------------------------------------------------------


def _usage_metadata(usage: Usage) -> dict[str, Any]:
    candidates = max(0, usage.output - usage.reasoning)
    out: dict[str, Any] = {
        "promptTokenCount": usage.prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": usage.prompt + usage.output,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": usage.prompt}],
    }
    if usage.cache_read:
        out["cachedContentTokenCount"] = usage.cache_read
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": usage.cache_read}]
    if usage.reasoning:
        out["thoughtsTokenCount"] = usage.reasoning
    return out


def _call_parts(reply: Reply) -> list[dict[str, Any]]:
    ids = [call.id or f"gemini_{reply.digest[24:40]}_{k}" for k, call in enumerate(reply.calls)]
    parts: list[dict[str, Any]] = []
    for k, call in enumerate(reply.calls):
        part: dict[str, Any] = {"functionCall": {"name": call.name, "args": call.input}}
        if k == 0:
            part["thoughtSignature"] = signature(ids)
        parts.append(part)
    return parts


def response(model: str, reply: Reply, usage: Usage) -> dict[str, Any]:
    """The whole GenerateContentResponse."""
    parts: list[dict[str, Any]] = []
    if reply.thinking:
        parts.append({"text": reply.thinking, "thought": True})
    if reply.text:
        parts.append({"text": reply.text})
    parts.extend(_call_parts(reply))
    candidate = {
        "content": {"parts": parts, "role": "model"},
        "finishReason": FINISH_REASONS[reply.stop],
        "index": 0,
    }
    return {
        "candidates": [candidate],
        "usageMetadata": _usage_metadata(usage),
        "modelVersion": model,
        "responseId": reply.digest[:22],
    }


def chunks(whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
    """The whole answer as the API streams it: thoughts and text in pieces of a few words,
    the calls whole in one chunk; the last chunk has the finishReason and the usage."""
    candidate = whole["candidates"][0]
    groups: list[list[dict[str, Any]]] = []
    calls: list[dict[str, Any]] = []
    for part in candidate["content"]["parts"]:
        if "functionCall" in part:
            calls.append(part)
            continue
        marks = {"thought": True} if part.get("thought") else {}
        groups.extend([{"text": p, **marks}] for p in text_pieces(part["text"], chunk_tokens))
    if calls:
        groups.append(calls)
    usage = whole["usageMetadata"]
    prompt_usage = {
        "promptTokenCount": usage["promptTokenCount"],
        "totalTokenCount": usage["promptTokenCount"],
        "promptTokensDetails": usage["promptTokensDetails"],
    }
    events = []
    for n, parts in enumerate(groups or [[]]):
        last = n == max(0, len(groups) - 1)
        piece: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if last:
            piece["finishReason"] = candidate["finishReason"]
        data = {
            "candidates": [piece],
            "usageMetadata": usage if last else prompt_usage,
            "modelVersion": whole["modelVersion"],
            "responseId": whole["responseId"],
        }
        kind = "end" if last else ("start" if n == 0 else "delta")
        events.append(event(kind, None, data))
    return events


def _gemini_sse(item: Event) -> bytes:
    return b"data: " + item.data + b"\r\n\r\n"


SSE = Framing("text/event-stream", _gemini_sse)
# The JSON array form: one element a chunk, as it comes.
ARRAY = Framing("application/json; charset=UTF-8", lambda item: item.data, b"[", b"\r\n,", b"]")


class GeminiApi(Api):
    """generateContent for one model, whole or streamed (the path says which)."""

    unparsable = "Invalid JSON payload received. {error}"
    faults = FAULTS

    def __init__(self, counter: TokenCounter, model: str, stream: bool = False) -> None:
        self.counter = GeminiCounter(counter)
        self.model_id = model
        self.stream = stream
        self.name = f"gemini {model}"  # the answer depends on the path's model

    def refuse(self, refusal: Refusal, request_id: str) -> web.Response:
        return google_error(refusal)

    def invalid(self, body: Any) -> Refusal | None:
        found = check_request(body, self.model_id)
        if found is not None:
            return refusal_of(found)
        if checks_signatures(self.model_id):
            return _forged_signature(body["contents"])
        return None

    def count(self, body: Any) -> int:
        return self.counter.count_request(body)

    def units(self, body: Any) -> list[Unit]:
        """Implicit caching: the instruction and tools, then every content, as prefixes."""
        fixed = {k: body.get(k) for k in ("systemInstruction", "tools") if k in body}
        running = self.counter.count_request({**fixed, "contents": []})
        pieces: list[tuple[bytes, Any, int]] = [(b"fixed", fixed, running)] if fixed else []
        for i, content in enumerate(body.get("contents") or ()):
            running += self.counter.count_message(content)
            pieces.append((f"content\0{i}".encode(), content, running))
        return prefix_units(f"gemini\0{self.model_id}".encode(), pieces, every_boundary=True)

    def too_long(self, tokens: int, window: int) -> Refusal | None:
        if tokens <= window:
            return None
        message = (
            f"The input token count ({tokens}) exceeds the maximum number of tokens allowed"
            f" ({window})."
        )
        return Refusal(400, "INVALID_ARGUMENT", message)

    def read(self, body: Any) -> Prompt:
        return read(body)

    def streaming(self, body: Any) -> bool:
        return self.stream

    def model(self, body: Any) -> str:
        return self.model_id

    def whole(self, body: Any, reply: Reply, usage: Usage) -> dict[str, Any]:
        return response(self.model_id, reply, usage)

    def events(self, body: Any, whole: dict[str, Any], chunk_tokens: int) -> list[Event]:
        return chunks(whole, chunk_tokens)

    def recorded(self, whole: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        return whole["candidates"][0]["content"]["parts"], whole["usageMetadata"]

    def stream_error(self, events: list[Event]) -> Event:
        return STREAM_ERROR


# -- routes -----------------------------------------------------------------------------------


def _version(request: web.Request) -> str:
    return request.path.split("/")[1]


def _not_found(model: str, method: str, version: str) -> Refusal:
    return Refusal(
        404,
        "NOT_FOUND",
        f"models/{model} is not found for API version {version}, or is not supported for"
        f" {method}. Call ListModels to see the list of available models and their supported"
        " methods.",
    )


def _platform_refusal(request: web.Request, model: str, method: str) -> Refusal | None:
    if api_key(request) is None:
        return Refusal(403, "PERMISSION_DENIED", UNREGISTERED)
    if model.removeprefix("models/") not in MODEL_IDS:
        return _not_found(model, method, _version(request))
    return None


async def handle_model(request: web.Request) -> web.StreamResponse:
    """POST models/{model}:{method}."""
    model, _, method = request.match_info["target"].rpartition(":")
    refusal = _platform_refusal(request, model, method or "this method")
    if refusal is None and method not in (
        "generateContent",
        "streamGenerateContent",
        "countTokens",
    ):
        refusal = Refusal(404, "NOT_FOUND", f"Method {method!r} not found.")
    if refusal is not None:
        request[RECORD].error = refusal.message
        return google_error(refusal)
    model = model.removeprefix("models/")
    if method == "countTokens":
        api = GeminiApi(request.app[COUNTER], model)
        return await count_tokens(request, api, _counted, _tokens)
    streaming = method == "streamGenerateContent"
    api = GeminiApi(request.app[COUNTER], model, streaming)
    framing = ARRAY if streaming and request.query.get("alt") != "sse" else SSE
    return await serve(request, api, framing)


COUNT_FIELDS = frozenset({"contents", "generateContentRequest", "generate_content_request"})


def _counted(body: Any) -> Checked:
    refusal = _count_refusal(body)
    if refusal is not None:
        return None, refusal
    inner = field(body, "generateContentRequest")
    counted = dict(inner) if isinstance(inner, dict) else {"contents": body.get("contents") or []}
    counted.pop("model", None)
    return counted, None


def _tokens(n: int) -> dict[str, Any]:
    return {"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}


def _count_refusal(body: Any) -> Refusal | None:
    if not isinstance(body, dict):
        return Refusal(
            400, "INVALID_ARGUMENT", "Invalid JSON payload received. Expected an object."
        )
    for name in body:
        if name not in COUNT_FIELDS:
            message = f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.'
            return Refusal(400, "INVALID_ARGUMENT", message)
    inner = field(body, "generateContentRequest")
    if inner is not None and body.get("contents") is not None:
        message = "contents and generate_content_request cannot both be set."
        return Refusal(400, "INVALID_ARGUMENT", message)
    if inner is not None and not (isinstance(inner, dict) and isinstance(inner.get("model"), str)):
        message = "* CountTokensRequest.generate_content_request.model: Model is required."
        return Refusal(400, "INVALID_ARGUMENT", message)
    found = structure_violation(inner if inner is not None else {"contents": body.get("contents")})
    return refusal_of(found) if found is not None else None


def _model_entry(model_id: str, name: str, window: int) -> dict[str, Any]:
    return {
        "name": f"models/{model_id}",
        "version": "001",
        "displayName": name,
        "description": f"{name}, served by the stand-in.",
        "inputTokenLimit": window,
        "outputTokenLimit": OUTPUT_LIMIT,
        "supportedGenerationMethods": list(GENERATION_METHODS),
        "temperature": 1,
        "topP": 0.95,
        "topK": 64,
        "maxTemperature": 2,
        "thinking": True,
    }


async def handle_models(request: web.Request) -> web.Response:
    """GET models (in pages) and models/{model} (under /v1 through the Messages stand-in's
    listing, which sends a Google key here)."""
    model = request.match_info.get("model") or request.match_info.get("model_id")
    refusal = Refusal(403, "PERMISSION_DENIED", UNREGISTERED) if api_key(request) is None else None
    windows = request.app[OPTIONS]
    listed = [_model_entry(m, name, windows.window_for(m)) for m, name, _ in MODELS]
    if refusal is None and model is not None:
        found = [m for m in listed if m["name"] == f"models/{model}"]
        if found:
            return web.json_response(found[0])
        message = f"models/{model} is not found for API version {_version(request)}"
        refusal = Refusal(404, "NOT_FOUND", message)
    if refusal is not None:
        request[RECORD].error = refusal.message
        return google_error(refusal)
    try:
        size = int(request.query.get("pageSize") or 50)
        start = int(request.query.get("pageToken") or 0)
    except ValueError:
        return google_error(Refusal(400, "INVALID_ARGUMENT", "Invalid pageSize or pageToken."))
    page: dict[str, Any] = {"models": listed[start : start + max(1, size)]}
    if start + max(1, size) < len(listed):
        page["nextPageToken"] = str(start + max(1, size))
    return web.json_response(page)


def add_routes(app: web.Application) -> None:
    for version in ("v1beta", "v1"):
        app.router.add_post(f"/{version}/models/{{target}}", handle_model)
    app.router.add_get("/v1beta/models", handle_models)
    app.router.add_get("/v1beta/models/{model}", handle_models)
