"""The listening socket: at most so many client connections, within the open-file limit.

Each client connection costs a file descriptor, and while its request runs another for
the upstream connection; Redis pools and the process itself need some more. A replica
that runs out of descriptors fails every request (the upstream cannot be reached:
"Too many open files"), so the number of client connections is capped below what the
limit allows: `server.max_connections`, lowered at start when the open-file limit is
smaller (the soft limit is first raised to the hard one), with a listen backlog to
match. A connection over the cap is closed at once; a client retries it. Slow clients
cannot hold their connections for long either: `server.header_timeout` (aiohttp's
keep-alive timer, which also runs from the moment a connection opens until its first
request is in) and `server.body_timeout` (proxy/server/bodies.py) close them.
"""

from __future__ import annotations

import asyncio
import logging
import resource

from aiohttp import web

log = logging.getLogger(__name__)

# Descriptors kept for everything but client connections and their upstream ones: the
# store's Redis pool (64 at most), the fleet's (8), logs, the interpreter's own.
RESERVED_FILES = 128


def raise_file_limit() -> int:
    """Raise the soft open-file limit to the hard one; return the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(configured: int) -> int:
    """`configured`, lowered so that what a connection may hold fits the file limit: its
    own descriptor, an upstream one, and a share of the connections accepted in one go
    (asyncio accepts up to the backlog before any is refused: `backlog_for`)."""
    files = raise_file_limit()
    fits = max(1, (files - RESERVED_FILES) // 3)
    if fits < configured:
        log.warning(
            "open-file limit %d: at most %d client connections (server.max_connections %d)",
            files,
            fits,
            configured,
        )
        return fits
    return configured


def backlog_for(cap: int) -> int:
    """The listen backlog: asyncio accepts that many connections at once, so it is kept
    to a quarter of the cap (at least 8, at most 1024)."""
    return max(8, min(1024, cap // 4))


class _Refused(asyncio.Protocol):
    """A connection over the cap: closed as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class CappedSite(web.TCPSite):
    """A TCP site whose server takes at most `max_connections` connections at once."""

    __slots__ = ("_max_connections",)

    def __init__(
        self, runner: web.BaseRunner, host: str, port: int, *, max_connections: int
    ) -> None:
        super().__init__(runner, host, port, backlog=backlog_for(max_connections))
        self._max_connections = max_connections

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        cap = self._max_connections

        def protocol() -> asyncio.BaseProtocol:
            if len(server.connections) >= cap:
                return _Refused()
            return server()

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            protocol, self._host, self._port, backlog=self._backlog
        )
