"""Which upstream a request goes to: the Anthropic one or the OpenAI-format one.

The rule, in order:
1. `/v1/messages` and everything under it: the Anthropic upstream (`upstream.url`);
   `/bedrock/` and `/vertex/` are the Anthropic API's too, each with its own upstream.
2. Paths only OpenAI's API serves (`/v1/chat/completions`, `/v1/completions`,
   `/v1/embeddings`, `/v1/responses`, ... see OPENAI_ONLY): the OpenAI upstream
   (`upstream.openai_url`).
3. Any other path (`/v1/models`, `/v1/files`, unknown ones): the OpenAI upstream when the
   request looks like an OpenAI client's (an `Authorization: Bearer` credential and no
   `anthropic-version` header, which the anthropic SDK and Claude Code always send),
   else the Anthropic upstream.

Only the path (never the query) and two headers decide, so the rule is cheap and a
client cannot name an upstream that is not configured. With proxy keys required, a key
is bound to one provider (proxy/server/auth.py): a path of the other API is refused, and
a path both APIs have goes to the key's own.

`upstream.openai_url` left empty means https://api.openai.com when keys are off (callers
send their own OpenAI credential) and no OpenAI upstream at all when keys are required:
a key store must name where its OpenAI credentials may go.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Literal

from aiohttp import web
from multidict import MultiMapping

from proxy.server.state import SETTINGS
from proxy.server.upstream import Upstream

Target = Literal["anthropic", "openai"]

OPENAI_ONLY = (
    "/v1/chat/",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/moderations",
    "/v1/audio/",
    "/v1/images/",
    "/v1/batches",
    "/v1/fine_tuning/",
    "/v1/assistants",
    "/v1/threads",
    "/v1/vector_stores",
    "/v1/uploads",
    "/v1/realtime",
    "/v1/conversations",
    "/v1/evals",
    "/v1/containers",
    "/v1/videos",
)

# Claude through a cloud (proxy/server/bedrock.py, vertex.py): the Anthropic API's, and
# authorised upstream with the proxy's own credential, never a caller's.
OWN_CREDENTIAL = ("/bedrock/", "/vertex/")

OPENAI_UPSTREAM = web.AppKey("openai_upstream", Upstream)
OPENAI_DEFAULT_URL = "https://api.openai.com"


def _under(path: str, prefix: str) -> bool:
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")


def provider_of_path(path: str) -> Target | None:
    """The API a path belongs to, or None for a path both have (/v1/models, ...)."""
    if _under(path, "/v1/messages") or path.startswith(OWN_CREDENTIAL):
        return "anthropic"
    if any(_under(path, prefix) for prefix in OPENAI_ONLY):
        return "openai"
    return None


def upstream_for(path: str, headers: MultiMapping[str]) -> Target:
    found = provider_of_path(path)
    if found is not None:
        return found
    bearer = headers.get("Authorization", "")[:7].lower() == "bearer "
    if bearer and "anthropic-version" not in headers:
        return "openai"
    return "anthropic"


async def openai_upstream_lifetime(app: web.Application) -> AsyncIterator[None]:
    """The OpenAI-format upstream: its own pool, the same timeouts as the Anthropic one."""
    settings = app[SETTINGS]
    url = settings.upstream.openai_url
    if not url and settings.auth.keys == "off":
        url = OPENAI_DEFAULT_URL
    app[OPENAI_UPSTREAM] = Upstream(replace(settings.upstream, url=url))
    yield
    await app[OPENAI_UPSTREAM].close()
