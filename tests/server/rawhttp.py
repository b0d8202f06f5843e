"""A minimal HTTP/1.1 client over a socket: sends exactly the bytes a test gives it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass
class RawResponse:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    complete: bool  # False: the connection ended inside the body

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)


async def open_connection(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None
    return await asyncio.open_connection(parts.hostname, parts.port, limit=2**24)


def request_head(
    url: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> bytes:
    """The request line and headers; Host (and Content-Length for a body) added when the
    test did not give them."""
    names = {k.lower() for k, _ in headers}
    if "host" not in names:
        headers = [("Host", urlsplit(url).netloc), *headers]
    if body and not names & {"content-length", "transfer-encoding"}:
        headers = [*headers, ("Content-Length", str(len(body)))]
    lines = [f"{method} {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    status = 100
    while 100 <= status < 200:  # skip interim answers (100 Continue)
        status = int((await reader.readline()).split()[1])
        headers: list[tuple[str, str]] = []
        while (line := await reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers.append((name, value.strip()))
    response = RawResponse(status, headers, b"", True)
    length = response.header("content-length")
    try:
        if length is not None:
            response.body = await reader.readexactly(int(length))
        elif (response.header("transfer-encoding") or "").lower() == "chunked":
            chunks = []
            while size := int((await reader.readline()).strip() or b"x", 16):
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            await reader.readline()
            response.body = b"".join(chunks)
        else:
            response.body = await reader.read()
    except (asyncio.IncompleteReadError, ValueError):
        response.complete = False
    return response


async def send(
    url: str, method: str, path: str, headers: list[tuple[str, str]], body: bytes = b""
) -> RawResponse:
    reader, writer = await open_connection(url)
    try:
        writer.write(request_head(url, method, path, headers, body) + body)
        await writer.drain()
        return await read_response(reader)
    finally:
        writer.close()
