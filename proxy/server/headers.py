"""Which headers cross the proxy: everything end-to-end, in its order and spelling.

Every request filters a dozen or two header names that are nearly always the same ones,
so each direction keeps its verdict per name as spelled (`_Verdicts`): a name is lowered
and tested once, not on every request.
"""

from __future__ import annotations

from multidict import CIMultiDict, MultiMapping

# RFC 9110 section 7.6.1: meaningful only for one hop, never forwarded (plus Proxy-*).
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "te", "trailer", "transfer-encoding", "upgrade"}
)
# The proxy sets Host from the upstream URL and recomputes Content-Length; it answers
# `Expect: 100-continue` itself (aiohttp does), so the upstream gets the body at once.
_REQUEST_DROP = HOP_BY_HOP | {"host", "content-length", "expect"}
_RESPONSE_DROP = HOP_BY_HOP | {"content-length"}

# The proxy's own request headers (`x-compaction-proxy-purpose: summary` on its summariser
# calls): set by the proxy only, so a client's never reach the upstream, whose logs can
# then tell the proxy's calls from a client's.
OWN_PREFIX = "x-compaction-proxy-"

# Names a direction remembers its verdict for; past this (a client inventing names) the
# rest are tested each time, as before.
VERDICTS = 512


class _Verdicts:
    """Whether a header name crosses in one direction, remembered per spelling."""

    __slots__ = ("_drop", "_known", "_prefixes")

    def __init__(self, drop: frozenset[str], prefixes: tuple[str, ...]) -> None:
        self._drop = drop
        self._prefixes = prefixes
        self._known: dict[str, bool] = {}

    def crosses(self, name: str) -> bool:
        verdict = self._known.get(name)
        if verdict is None:
            lower = name.lower()
            verdict = lower not in self._drop and not lower.startswith(self._prefixes)
            if len(self._known) < VERDICTS:
                self._known[name] = verdict
        return verdict

    def keep(self, headers: MultiMapping[str]) -> list[tuple[str, str]]:
        known = self._known
        kept = []
        for name, value in headers.items():
            verdict = known.get(name)
            if verdict is None:
                verdict = self.crosses(name)
            if verdict:
                kept.append((name, value))
        if "Connection" in headers:  # names the sender declared hop-by-hop there, too
            named = _named_in_connection(headers)
            kept = [(name, value) for name, value in kept if name.lower() not in named]
        return kept


def _named_in_connection(headers: MultiMapping[str]) -> frozenset[str]:
    """Headers the sender declared hop-by-hop by listing them in Connection (which may
    appear more than once)."""
    values = headers.getall("Connection", ())
    return frozenset(name.strip().lower() for value in values for name in value.split(","))


_TO_UPSTREAM = _Verdicts(_REQUEST_DROP, ("proxy-", OWN_PREFIX))
_TO_CLIENT = _Verdicts(_RESPONSE_DROP, ("proxy-",))


def upstream_request_headers(headers: MultiMapping[str]) -> list[tuple[str, str]]:
    """The client's end-to-end headers, to send upstream as they came (less the proxy's
    own, which only the proxy sets)."""
    return _TO_UPSTREAM.keep(headers)


def client_response_headers(headers: MultiMapping[str]) -> CIMultiDict[str]:
    """The upstream's end-to-end response headers, to send to the client as they came.
    Content-Encoding stays: bodies are relayed compressed, exactly as received."""
    return CIMultiDict(_TO_CLIENT.keep(headers))
