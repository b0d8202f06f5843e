"""The scripted coding agent (proxy/testing/agent_loop.py) on the Gemini API, through
google-genai: a test extra, so this lives in tests/ (all of proxy/ imports with the base
install alone).

It calls the client's `run_shell_command` function and answers each call with a
functionResponse (`{"output": ...}`), as Gemini CLI does; the model's turns go back as
they came, thought signatures included. The API sends no call ids: calls and responses
pair by position.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from google import genai
from google.genai import types

from proxy.testing.agent_loop import (
    RULES,
    TASK,
    ScriptedAgent,
    proxy_headers,
    script_headers,
    tool_output,
)
from proxy.testing.agent_loop import turn_script as loop_turn_script

TOOL = "run_shell_command"
DECLARATION = types.FunctionDeclaration(
    name=TOOL,
    description="Run a shell command in the repository and return its output.",
    parameters_json_schema={
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
)


@dataclass
class GeminiTurn:
    response: types.GenerateContentResponse  # the last chunk's, when streamed
    content: types.Content  # the model's turn (assembled from the chunks when streamed)
    headers: dict[str, str] = field(default_factory=dict)  # the proxy's x-compaction-*
    chunks: list[types.GenerateContentResponse] = field(default_factory=list)

    @property
    def calls(self) -> list[types.FunctionCall]:
        return [p.function_call for p in self.content.parts or () if p.function_call]


def _assembled(chunks: list[types.GenerateContentResponse]) -> types.Content:
    """A streamed turn as the client keeps it: every chunk's parts, in order."""
    parts = [
        part
        for chunk in chunks
        for candidate in chunk.candidates or ()
        for part in (candidate.content.parts if candidate.content else None) or ()
    ]
    return types.Content(role="model", parts=parts)


@dataclass
class GeminiAgent(ScriptedAgent):
    client: genai.Client

    def opening(self) -> list[dict[str, Any]]:
        return [self.user(TASK)]

    async def ask(self, turn: int, history: list[dict[str, Any]]) -> GeminiTurn:
        script = loop_turn_script(turn, self.read_every, TOOL, "command")
        config = types.GenerateContentConfig(
            system_instruction=RULES,
            tools=[types.Tool(function_declarations=[DECLARATION])],
            max_output_tokens=self.max_tokens,
            http_options=types.HttpOptions(headers=script_headers(script, self.conversation)),
        )
        contents: Any = [types.Content.model_validate(h) for h in history]
        models = self.client.aio.models
        if not self.stream:
            response = await models.generate_content(
                model=self.model, contents=contents, config=config
            )
            candidate = (response.candidates or [types.Candidate()])[0]
            content = candidate.content or types.Content(role="model", parts=[])
            return GeminiTurn(response, content, _headers(response))
        stream = await models.generate_content_stream(
            model=self.model, contents=contents, config=config
        )
        chunks = [chunk async for chunk in stream]
        return GeminiTurn(chunks[-1], _assembled(chunks), _headers(chunks[0]), chunks)

    def said(self, answer: GeminiTurn) -> tuple[list[dict[str, Any]], list[str]]:
        kept = answer.content.model_dump(mode="json", exclude_none=True)
        kept["role"] = "model"
        return [kept], [str(k) for k in range(len(answer.calls))]

    def results(self, turn: int, call_ids: list[str]) -> list[dict[str, Any]]:
        output = tool_output(turn, self.result_chars)
        response = {"name": TOOL, "response": {"output": output}}
        return [{"role": "user", "parts": [{"function_response": response} for _ in call_ids]}]

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "parts": [{"text": text}]}


def _headers(response: types.GenerateContentResponse) -> dict[str, str]:
    answered = response.sdk_http_response
    return proxy_headers(answered.headers or {}) if answered is not None else {}
