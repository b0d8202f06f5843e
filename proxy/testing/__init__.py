"""The stand-in upstream: a local, strict imitation of the model APIs, and scripted agents.

Used by the tests, the benchmarks, and anyone who wants to try the proxy without an API
key (`compaction-proxy stand-in`). One pipeline answers every API (answering.py):

    request -> Api.gate -> script (x-stand-in) -> status fault -> parse, Api.invalid,
    Api.count and the window, Api.read (a neutral Prompt, prompt.py) -> the script, a
    scenario or the summariser decides one neutral Reply (reply.py) -> usage (the prompt
    cache, cache.py) -> Api.whole (JSON) or Api.events (a stream) -> the transport

The script never sees an API's shape, and an API never decides what to answer: the
same script gives the same answer in every API. Transports: HTTP JSON and SSE
(standin_http.py), the Responses WebSocket (responses_ws.py); each sends the same
`Event`s (api.py), framed its own way.

How to add a stand-in API:

1. Write `api_<name>.py` with a subclass of `api.Api`: the reader (`read`: a valid body as
   a `Prompt`: its entries of `Text`, `Call` and `Result` parts, the tools offered, the
   output limit), the renderer (`whole`: a `Reply` and its `Usage` as the API's JSON;
   `events`: that JSON as the API streams it, each `Event` marked "start", "delta",
   "end" or other, which is where the script's delays and faults strike), and its rules
   (`gate`, `invalid`, `count`, `units`, `too_long`, errors in its shape: `refuse`,
   `faults`, `unparsable`, `stream_error`). An API that carries another's answers (an
   envelope: Bedrock's and Vertex's Messages bodies) reuses that API's reader and renderer
   and changes what differs: its routes, its gate, its errors, its framing.
2. Add its routes in the same module (`add_routes(app)`): a POST route is usually one line,
   `await answering.serve(request, MyApi(...))`, with a `standin_http.Framing` when its
   stream is not SSE (an AWS event stream: each `Event`'s data in a frame of its own) and
   `Api.response_headers` for headers of its own. A route with its own transport (a
   WebSocket) calls `answering.answer(...)` and sends the `Streamed` events itself, paced
   by `standin_http.paced` (delays and faults), as responses_ws.py does.
3. Register `add_routes` in `standin.APIS`; test it through the API's real SDK
   (tests/testing/test_<name>_standin.py).

The scripted agents share one loop (agent_loop.py); an API's agent is an adapter of five
small methods (agent.py, agent_openai.py, agent_responses.py).
"""

from proxy.testing.standin import (
    RECORDED,
    RecordedRequest,
    StandInOptions,
    create_app,
    run,
)

__all__ = ["RECORDED", "RecordedRequest", "StandInOptions", "create_app", "run"]
