"""A raw upstream for relay tests: answers every request with scripted bytes.

A script is a list of steps: bytes (one chunk of the chunked body, written and drained
on its own), a float (sleep that many seconds), or `CUT` (close the connection without
the last chunk). After the steps the body ends properly unless it was cut.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

CUT = "cut"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
    b"request-id: req_raw\r\nTransfer-Encoding: chunked\r\n\r\n"
)


@dataclass
class RawUpstream:
    scripts: dict[str, list[Any]] = field(default_factory=dict)  # path_qs -> steps
    closed: dict[str, asyncio.Event] = field(default_factory=dict)  # path_qs -> peer gone
    server: asyncio.Server | None = None
    url: str = ""

    async def start(self) -> RawUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split()[1]
                length = next(
                    (
                        int(v)
                        for k, _, v in (ln.partition(":") for ln in lines[1:])
                        if k.lower() == "content-length"
                    ),
                    0,
                )
                await reader.readexactly(length)
                if not await self._answer(path, reader, writer):
                    return
        writer.close()

    async def _answer(
        self, path: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        closed = self.closed.setdefault(path, asyncio.Event())
        writer.write(SSE_HEAD)
        for step in self.scripts.get(path, []):
            if step == CUT:
                writer.close()
                return False
            if isinstance(step, float):
                # Sleep, but notice the peer going away meanwhile.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(step):
                        if await reader.read(1) == b"":
                            closed.set()
                            writer.close()
                            return False
                continue
            writer.write(b"%x\r\n%s\r\n" % (len(step), step))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
