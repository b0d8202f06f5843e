"""Paths the proxy does not handle itself go through unchanged, both ways."""

from __future__ import annotations

import gzip

import orjson
from aiohttp import web

from tests.plugins.standin import RunningStandIn
from tests.server.conftest import MakeProxy
from tests.server.rawhttp import RawResponse, open_connection, read_response, request_head, send

HEADERS = [("x-api-key", "sk-test"), ("anthropic-version", "2023-06-01")]
VARYING = {"date", "request-id", "content-length", "transfer-encoding", "connection"}


def stable_headers(response: RawResponse) -> list[tuple[str, str]]:
    return [(k, v) for k, v in response.headers if k.lower() not in VARYING]


async def test_get_and_unknown_paths_pass_through(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    for path in (
        "/v1/models?limit=2&after_id=x%2Fy",
        "/v1/models/claude-haiku-4-5-20251001",
        "/v1/nothing/here?beta=true",
        "/v1/messages",
    ):
        for method in ("GET", "DELETE"):
            direct = await send(standin.url, method, path, HEADERS)
            proxied = await send(proxy.url, method, path, HEADERS)
            assert (proxied.status, stable_headers(proxied)) == (
                direct.status,
                stable_headers(direct),
            )
            assert orjson.loads(proxied.body).keys() == orjson.loads(direct.body).keys()
            assert standin.recorded[-1].path_qs == path
            assert standin.recorded[-1].method == method


async def test_a_chunked_upload_to_another_path_streams_through(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    reader, writer = await open_connection(proxy.url)
    headers = [*HEADERS, ("Transfer-Encoding", "chunked"), ("Content-Type", "text/plain")]
    writer.write(request_head(proxy.url, "PUT", "/v1/files?x=1", headers))
    pieces = [b"first piece\n", b"x" * 100_000, b"last"]
    for piece in pieces:
        writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    response = await read_response(reader)
    writer.close()
    assert response.status == 404  # the stand-in has no files API; it answers in shape
    seen = standin.recorded[-1]
    assert (seen.method, seen.path_qs, seen.body) == ("PUT", "/v1/files?x=1", b"".join(pieces))
    assert seen.headers["Content-Type"] == "text/plain"


async def test_a_sized_upload_keeps_its_length(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    body = b"\x00\x01binary\xff" * 1000
    await send(proxy.url, "POST", "/v1/files", [*HEADERS, ("Content-Type", "x/y")], body)
    seen = standin.recorded[-1]
    assert seen.body == body
    assert seen.headers["Content-Length"] == str(len(body))
    assert "Transfer-Encoding" not in seen.headers


async def test_compressed_answers_stay_compressed(make_proxy: MakeProxy) -> None:
    answer = gzip.compress(b'{"data": []}' * 100)

    async def models(request: web.Request) -> web.Response:
        assert request.headers["Accept-Encoding"] == "gzip, br"
        return web.Response(
            body=answer, headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
        )

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        proxy = await make_proxy(f"http://{host}:{port}")
        response = await send(proxy.url, "GET", "/v1/models", [("Accept-Encoding", "gzip, br")])
        assert response.status == 200
        assert response.header("content-encoding") == "gzip"
        assert response.body == answer
    finally:
        await runner.cleanup()


async def test_an_absolute_target_cannot_pick_the_upstream(
    standin: RunningStandIn, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(standin.url)
    for method, target in (
        ("GET", "http://elsewhere.example/v1/models"),
        ("POST", "http://elsewhere.example/v1/messages"),
    ):
        response = await send(proxy.url, method, target, HEADERS, b"{}")
        assert response.status == 400
        assert orjson.loads(response.body)["error"]["type"] == "invalid_request_error"
    assert standin.recorded == []
