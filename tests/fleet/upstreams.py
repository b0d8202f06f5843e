"""Upstreams for the enforcement tests: the stand-in taught the pass-through APIs a key
may try to reach (files, message batches, legacy completions, embeddings, OpenAI
batches), each answering in its API's shape with usage where the API reports it, and
recording every request (the stand-in's own middleware), served from a thread so
`serve` subprocesses and sync clients can reach it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
from aiohttp import web

from proxy.core.tokens import default_counter
from proxy.testing.standin import RECORDED, RecordedRequest, StandInOptions, create_app

COUNTER = default_counter()
FILES = {"data": [{"id": "file_team_a", "filename": "team-a-plans.txt"}], "has_more": False}
BATCHES = {"data": [{"id": "msgbatch_team_a", "processing_status": "ended"}], "has_more": False}


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(value), content_type="application/json")


async def _body(request: web.Request) -> dict[str, Any]:
    found = orjson.loads(await request.read())
    assert isinstance(found, dict)
    return found


async def list_files(request: web.Request) -> web.Response:
    return _json(FILES)


async def file_content(request: web.Request) -> web.Response:
    return web.Response(body=b"team A's plans for the quarter", content_type="text/plain")


async def upload_file(request: web.Request) -> web.Response:
    return _json({"id": "file_new", "filename": "upload.txt"})


async def list_batches(request: web.Request) -> web.Response:
    return _json(BATCHES)


async def create_batch(request: web.Request) -> web.Response:
    body = await _body(request)
    count = len(body.get("requests") or [])
    return _json({"id": "msgbatch_new", "type": "message_batch", "request_counts": count})


async def batch_results(request: web.Request) -> web.Response:
    line = {"custom_id": "a", "result": {"type": "succeeded"}}
    return web.Response(body=orjson.dumps(line) + b"\n", content_type="application/x-jsonl")


async def complete(request: web.Request) -> web.Response:
    body = await _body(request)  # the legacy Text Completions API reports no usage
    return _json({"type": "completion", "completion": " Fine.", "model": body.get("model")})


async def completions(request: web.Request) -> web.Response:
    body = await _body(request)
    prompt = COUNTER.count_json(body.get("prompt"))
    choices = int(body.get("n") or 1)
    usage = {"prompt_tokens": prompt, "completion_tokens": 2 * choices}
    return _json(
        {
            "object": "text_completion",
            "model": body.get("model"),
            "choices": [
                {"text": " ok", "index": n, "finish_reason": "stop"} for n in range(choices)
            ],
            "usage": {**usage, "total_tokens": prompt + 2 * choices},
        }
    )


async def embeddings(request: web.Request) -> web.Response:
    body = await _body(request)
    tokens = COUNTER.count_json(body.get("input"))
    return _json(
        {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


async def openai_batch(request: web.Request) -> web.Response:
    return _json({"id": "batch_new", "object": "batch", "status": "validating"})


def api_app(options: StandInOptions | None = None) -> web.Application:
    app = create_app(options or StandInOptions(max_recorded=None))
    app.router.add_get("/v1/files", list_files)
    app.router.add_post("/v1/files", upload_file)
    app.router.add_get("/v1/files/{file_id}/content", file_content)
    app.router.add_get("/v1/messages/batches", list_batches)
    app.router.add_post("/v1/messages/batches", create_batch)
    app.router.add_get("/v1/messages/batches/{batch_id}/results", batch_results)
    app.router.add_post("/v1/complete", complete)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/batches", openai_batch)
    return app


class ThreadedApp:
    """An aiohttp app on a loopback port, its loop in a daemon thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0)
        self.call(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.call(site.start())
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    def call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=30)

    @property
    def recorded(self) -> list[RecordedRequest]:
        return self.app[RECORDED]

    def stop(self) -> None:
        self.call(self.runner.cleanup())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@contextmanager
def running(make: Callable[[], web.Application]) -> Iterator[ThreadedApp]:
    served = ThreadedApp(make())
    try:
        yield served
    finally:
        served.stop()
