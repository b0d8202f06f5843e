"""Which headers cross the proxy: everything end-to-end, in its order and spelling."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, MultiMapping

# RFC 9110 section 7.6.1: meaningful only for one hop, never forwarded (plus Proxy-*).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)
# The proxy sets Host from the upstream URL and recomputes Content-Length; it answers
# `Expect: 100-continue` itself (aiohttp does), so the upstream gets the body at once.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length"}
_NOTHING: frozenset[str] = frozenset()


def _named_in_connection(headers: MultiMapping[str]) -> frozenset[str]:
    """Headers the sender declared hop-by-hop by listing them in Connection (which may
    appear more than once)."""
    values = headers.getall("Connection", ())
    if not values:
        return _NOTHING
    return frozenset(name.strip().lower() for value in values for name in value.split(","))


# The proxy's own request headers (`x-compaction-proxy-purpose: summary` on its summariser
# calls): set by the proxy only, so a client's never reach the upstream, whose logs can
# then tell the proxy's calls from a client's.
OWN_PREFIX = "x-compaction-proxy-"


def _keep(
    pairs: Iterable[tuple[str, str]],
    drop: frozenset[str],
    extra: frozenset[str],
    prefixes: tuple[str, ...] = ("proxy-",),
) -> list[tuple[str, str]]:
    if extra:
        drop = drop | extra
    return [
        (name, value)
        for name, value in pairs
        if (lower := name.lower()) not in drop and not lower.startswith(prefixes)
    ]


def upstream_request_headers(headers: MultiMapping[str]) -> list[tuple[str, str]]:
    """The client's end-to-end headers, to send upstream as they came (less the proxy's
    own, which only the proxy sets)."""
    return _keep(
        headers.items(), _REQUEST_DROP, _named_in_connection(headers), ("proxy-", OWN_PREFIX)
    )


def client_response_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """The upstream's end-to-end response headers, to send to the client as they came.
    Content-Encoding stays: bodies are relayed compressed, exactly as received."""
    return CIMultiDict(_keep(headers.items(), _RESPONSE_DROP, _named_in_connection(headers)))
