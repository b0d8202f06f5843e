"""Envelopes: what a provider's request carries outside the API body it wraps.

A route maps a path to its wire format, its transport, its upstream (with a signer when
the provider wants one) and its envelope. Anthropic's and OpenAI's own APIs carry
everything in the body: the model, the stream flag; betas ride in a header (`PLAIN`).
A provider that wraps an API body differently (Bedrock and Vertex carry a Messages body
with `model` in the URL path and `anthropic_version` in the body; Bedrock its betas in
the body too, and its stream in the path) is an envelope of its own, in a module of its
own, named by its routes: the exchange then reads the model, the betas and the stream
flag through it, and sends the summariser's request (built by the wire format as a
plain API body) as the envelope says.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.commands import GetSummary


class Envelope(Protocol):
    def model(self, path: str, payload: Mapping[str, Any]) -> str:
        """The model a request asks for."""
        ...

    def betas(self, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
        """Its betas, as one comma list (a model reaches 1M with `context-1m-...`)."""
        ...

    def stream(self, path: str, payload: Mapping[str, Any]) -> bool:
        """Whether the client asked for a stream."""
        ...

    def summary(self, path: str, need: GetSummary) -> tuple[str, GetSummary]:
        """The summariser's request (API bodies the wire format made, `model` in them:
        `need.body`, its exact bytes `need.encoded` when made in place, and
        `need.fallback`) as this envelope sends it: its path, and the ask with its
        bodies rewrapped. `path` is the request's."""
        ...


def betas_of(headers: Mapping[str, str]) -> str:
    """Every `anthropic-beta` value of the request, as one comma list."""
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # a request's: looked up
        return ",".join(headers.getall("anthropic-beta", ()))
    return ",".join(v for k, v in headers.items() if k.lower() == "anthropic-beta")


class Plain:
    """The API's own body: model and stream flag in it, betas in `anthropic-beta`."""

    def model(self, path: str, payload: Mapping[str, Any]) -> str:
        return str(payload.get("model", ""))

    def betas(self, headers: Mapping[str, str], payload: Mapping[str, Any]) -> str:
        return betas_of(headers)

    def stream(self, path: str, payload: Mapping[str, Any]) -> bool:
        return payload.get("stream") is True

    def summary(self, path: str, need: GetSummary) -> tuple[str, GetSummary]:
        return path, need


PLAIN = Plain()
