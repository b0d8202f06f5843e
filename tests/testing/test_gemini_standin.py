"""The Gemini stand-in through google-genai, unmodified: whole, streamed (SSE) and JSON
array answers, countTokens, the model listing, function calling with thought
signatures, read_result calls, implicit caching, faults, and what it refuses in
Google's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2 as httpx
import pytest
from google import genai
from google.genai import errors, types

from proxy.testing.api_gemini import signature, signed_ids
from proxy.testing.standin import StandInOptions
from tests.gemini_agent import DECLARATION
from tests.plugins.standin import RunningStandIn

FLASH = "gemini-2.5-flash"
GEMINI_3 = "gemini-3-flash-preview"
SHELL = DECLARATION  # run_shell_command, as Gemini CLI declares it
TOOLS = [types.Tool(function_declarations=[SHELL])]


@pytest.fixture
def gemini(make_standin_thread: Any) -> Iterator[RunningStandIn]:
    yield make_standin_thread(StandInOptions(cache_min_tokens=64))


def _client(standin: RunningStandIn, **headers: str) -> genai.Client:
    options = types.HttpOptions(
        base_url=standin.url, headers=headers, retry_options=types.HttpRetryOptions(attempts=1)
    )
    return genai.Client(api_key="test-key", http_options=options)


def _script(**keys: Any) -> dict[str, str]:
    return {"x-stand-in": json.dumps(keys)}


def test_whole_streamed_counted_and_listed(gemini: RunningStandIn) -> None:
    client = _client(gemini)
    whole = client.models.generate_content(model=FLASH, contents="What does src/app.py do?")
    assert whole.text is not None and "24 characters" in whole.text
    usage = whole.usage_metadata
    assert usage is not None and usage.prompt_token_count and usage.candidates_token_count
    assert usage.total_token_count == usage.prompt_token_count + usage.candidates_token_count
    chunks = list(
        client.models.generate_content_stream(model=FLASH, contents="What does src/app.py do?")
    )
    assert len(chunks) > 1 and "".join(c.text or "" for c in chunks) == whole.text
    assert [c.candidates[0].finish_reason for c in chunks if c.candidates][-1] == "STOP"
    last = chunks[-1].usage_metadata
    assert last is not None and last.candidates_token_count == usage.candidates_token_count
    counted = client.models.count_tokens(model=FLASH, contents="What does src/app.py do?")
    assert counted.total_tokens == usage.prompt_token_count
    names = [m.name for m in client.models.list(config={"page_size": 4})]
    assert "models/gemini-2.5-flash" in names and "models/gemini-3.5-flash-lite" in names
    model = client.models.get(model=FLASH)
    assert model.input_token_limit == 200_000 and model.output_token_limit == 65_536
    paths = [r.path_qs for r in gemini.recorded]
    assert paths[:3] == [
        f"/v1/models/{FLASH}:generateContent",
        f"/v1/models/{FLASH}:streamGenerateContent?alt=sse",
        f"/v1/models/{FLASH}:countTokens",
    ]
    assert gemini.recorded[0].headers["x-goog-api-key"] == "test-key"


def test_the_json_array_form_and_the_key_in_the_query(gemini: RunningStandIn) -> None:
    body = {"contents": [{"role": "user", "parts": [{"text": "What does src/app.py do?"}]}]}
    url = f"{gemini.url}/v1beta/models/{FLASH}:streamGenerateContent?key=test-key"
    answer = httpx.post(url, json=body)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith(
        "application/json"
    )
    assert answer.text.startswith("[{") and answer.text.endswith("}]")
    chunks = answer.json()
    assert len(chunks) > 1 and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert all("usageMetadata" in c for c in chunks)
    anonymous = httpx.post(url.split("?")[0], json=body)
    assert anonymous.status_code == 403
    assert anonymous.json()["error"]["status"] == "PERMISSION_DENIED"


def test_function_calls_carry_signatures_the_next_turn_must_return(
    gemini: RunningStandIn,
) -> None:
    call = {"name": "run_shell_command", "input": {"command": "ls -la"}}
    client = _client(gemini, **_script(tool=call))
    config = types.GenerateContentConfig(tools=TOOLS)
    first = client.models.generate_content(
        model=GEMINI_3, contents="List the files.", config=config
    )
    assert first.function_calls is not None
    (made,) = first.function_calls
    assert made.name == "run_shell_command" and made.args == {"command": "ls -la"}
    assert made.id is None  # the API sends no call ids
    turn = first.candidates[0].content  # type: ignore[index]
    assert turn is not None and turn.parts is not None
    signed = turn.parts[0].thought_signature
    assert signed is not None
    answered = types.Content(
        role="user",
        parts=[types.Part.from_function_response(name=made.name, response={"output": "a b"})],
    )
    history = [types.Content(role="user", parts=[types.Part(text="List the files.")]), turn]
    plain = _client(gemini)
    again = plain.models.generate_content(
        model=GEMINI_3, contents=[*history, answered], config=config
    )
    assert again.text is not None
    lost = types.Content(
        role="model", parts=[types.Part(function_call=turn.parts[0].function_call)]
    )
    with pytest.raises(errors.ClientError, match="thought_signature") as refused:
        plain.models.generate_content(
            model=GEMINI_3, contents=[history[0], lost, answered], config=config
        )
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
    forged = types.Content(
        role="model",
        parts=[types.Part(function_call=made, thought_signature=b"not the model's")],
    )
    with pytest.raises(errors.ClientError, match="thought signature"):
        plain.models.generate_content(
            model=GEMINI_3, contents=[history[0], forged, answered], config=config
        )
    dummy = types.Content(
        role="model",
        parts=[
            types.Part(function_call=made, thought_signature=b"skip_thought_signature_validator")
        ],
    )
    assert plain.models.generate_content(
        model=GEMINI_3, contents=[history[0], dummy, answered], config=config
    ).text
    streamed = list(
        client.models.generate_content_stream(
            model=GEMINI_3, contents="List the files.", config=config
        )
    )
    parts = [p for c in streamed for p in c.candidates[0].content.parts]  # type: ignore[index,union-attr]
    assert [p.thought_signature for p in parts if p.function_call] == [signed]


def test_signatures_hold_the_ids_of_the_calls() -> None:
    assert signed_ids(signature(["toolu_step003_0abc", "toolu_step003_1abc"])) == [
        "toolu_step003_0abc",
        "toolu_step003_1abc",
    ]
    assert signed_ids("skip_thought_signature_validator") is None
    assert signed_ids(None) is None


def test_read_result_is_called_for_a_stub_in_the_history(gemini: RunningStandIn) -> None:
    stub = 'Offloaded: call read_result(ref="r_0123456789abcdef", start=0, length=2000)'
    read_result = types.FunctionDeclaration(
        name="read_result",
        description="Reads an offloaded result.",
        parameters_json_schema={"type": "object", "properties": {"ref": {"type": "string"}}},
    )
    history = [
        types.Content(role="user", parts=[types.Part(text="List the files.")]),
        types.Content(
            role="model",
            parts=[
                types.Part(
                    function_call=types.FunctionCall(name="run_shell_command", args={}),
                    thought_signature=b"skip_thought_signature_validator",
                )
            ],
        ),
        types.Content(
            role="user",
            parts=[
                types.Part.from_function_response(
                    name="run_shell_command", response={"output": stub}
                )
            ],
        ),
    ]
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[SHELL, read_result])]
    )
    client = _client(gemini, **_script(read_result=True))
    answer = client.models.generate_content(model=FLASH, contents=history, config=config)
    assert answer.function_calls is not None
    (read,) = answer.function_calls
    assert read.name == "read_result" and read.args is not None
    assert read.args["ref"] == "r_0123456789abcdef"


def test_a_repeated_prefix_is_read_from_the_implicit_cache(gemini: RunningStandIn) -> None:
    client = _client(gemini)
    long_text = "The repository holds src/app.py and many other files. " * 40
    history = [types.Content(role="user", parts=[types.Part(text=long_text)])]
    first = client.models.generate_content(model=FLASH, contents=history)
    assert first.usage_metadata is not None
    assert first.usage_metadata.cached_content_token_count is None
    turn = first.candidates[0].content  # type: ignore[index]
    assert turn is not None
    follow = types.Content(role="user", parts=[types.Part(text="And then?")])
    second = client.models.generate_content(model=FLASH, contents=[*history, turn, follow])
    usage = second.usage_metadata
    assert usage is not None and usage.cached_content_token_count
    assert usage.cached_content_token_count >= first.usage_metadata.prompt_token_count - 8  # type: ignore[operator]
    assert usage.cached_content_token_count < usage.prompt_token_count  # type: ignore[operator]


def test_faults_in_googles_shape(gemini: RunningStandIn) -> None:
    limiting = _client(gemini, **_script(fault="429"))
    with pytest.raises(errors.ClientError) as limited:
        limiting.models.generate_content(model=FLASH, contents="hi")
    assert limited.value.code == 429 and limited.value.status == "RESOURCE_EXHAUSTED"
    details = limited.value.details["error"]["details"]
    assert details[0]["@type"] == "type.googleapis.com/google.rpc.RetryInfo"
    assert details[0]["retryDelay"] == "1s"
    overloading = _client(gemini, **_script(fault="529"))
    with pytest.raises(errors.ServerError) as overloaded:
        overloading.models.generate_content(model=FLASH, contents="hi")
    assert overloaded.value.code == 503 and overloaded.value.status == "UNAVAILABLE"
    breaking = _client(gemini, **_script(fault="stream_error"))
    with pytest.raises(errors.ServerError) as broken:
        list(breaking.models.generate_content_stream(model=FLASH, contents="What is it?"))
    assert broken.value.code == 503
    cutting = _client(gemini, **_script(fault="eof"))
    with pytest.raises(httpx.HTTPError):
        list(cutting.models.generate_content_stream(model=FLASH, contents="What is it?"))
    assert gemini.recorded[-1].outcome == "cut"


def test_what_it_refuses(gemini: RunningStandIn) -> None:
    client = _client(gemini)
    with pytest.raises(errors.ClientError, match="is not found for API version v1") as missing:
        client.models.generate_content(model="gemini-nope", contents="hi")
    assert missing.value.code == 404 and missing.value.status == "NOT_FOUND"
    url = f"{gemini.url}/v1beta/models/{FLASH}:generateContent"
    headers = {"x-goog-api-key": "test-key"}
    empty = httpx.post(url, headers=headers, json={"contents": [{"role": "user", "parts": []}]})
    assert empty.status_code == 400
    assert empty.json()["error"] == {
        "code": 400,
        "message": "* GenerateContentRequest.contents[0].parts: contents.parts must not be empty.",
        "status": "INVALID_ARGUMENT",
    }
    unknown = httpx.post(url, headers=headers, json={"contents": [], "temperature": 1})
    assert 'Unknown name "temperature"' in unknown.json()["error"]["message"]
    garbled = httpx.post(url, headers=headers, content=b"{not json")
    assert garbled.status_code == 400
    assert garbled.json()["error"]["message"].startswith("Invalid JSON payload received.")
    gemini.options.windows[FLASH] = 10
    long = client.models.count_tokens(model=FLASH, contents="a b c d e f g h i j k l m n o p")
    with pytest.raises(errors.ClientError, match=r"input token count \(\d+\) exceeds the maximum"):
        client.models.generate_content(model=FLASH, contents="a b c d e f g h i j k l m n o p")
    assert long.total_tokens is not None and long.total_tokens > 10


def test_thoughts_are_shown_only_when_asked_for(gemini: RunningStandIn) -> None:
    client = _client(gemini, **_script(thinking=True))
    shown = types.GenerateContentConfig(thinking_config=types.ThinkingConfig(include_thoughts=True))
    answer = client.models.generate_content(model=GEMINI_3, contents="Why?", config=shown)
    parts = answer.candidates[0].content.parts  # type: ignore[index,union-attr]
    assert parts is not None and [p.thought for p in parts] == [True, None]
    usage = answer.usage_metadata
    assert usage is not None and usage.thoughts_token_count
    assert usage.total_token_count == (
        usage.prompt_token_count + usage.candidates_token_count + usage.thoughts_token_count  # type: ignore[operator]
    )
    hidden = client.models.generate_content(model=GEMINI_3, contents="Why?")
    assert [p.thought for p in hidden.candidates[0].content.parts] == [None]  # type: ignore[index,union-attr]
