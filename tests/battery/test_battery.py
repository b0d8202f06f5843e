"""The differential battery (issue 36): Hypothesis draws conversations of the kind agents
send, valid and broken, and sends each through a real `compaction-proxy serve` (the
battery's small policy, real Redis) to the strict stand-in, for every format the proxy
speaks: Messages, Chat, Responses, Messages in Bedrock's and Vertex's envelopes, and
the Gemini API's generateContent. tests/battery/harness.py says what
is checked of each exchange; the end of each test reads serve's whole log for errors
that escaped.

Size: BATTERY_EXAMPLES examples per test (default VALID / INVALID, tens of seconds on
two cores), BATTERY_SEED the seed (README, "Set-up").
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson
import pytest
import requests
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from proxy.testing.google_oauth import TOKEN_PATH, write_service_account
from proxy.testing.standin import StandInOptions
from tests.battery.generate import (
    BYTE_MUTATIONS,
    DEEP_BYTES,
    FORMATS,
    MUTATIONS,
    STREAMS,
    Conversation,
    Format,
    Streamed,
    byte_exact,
    conversations,
    deep_input,
    encode,
)
from tests.battery.harness import (
    PURPOSE,
    STUB_READ,
    UNHANDLED,
    Exchange,
    Serve,
    assert_error,
    battery_examples,
    check_invalid,
    check_odd,
    check_valid,
    exchange,
    header,
    serve,
)
from tests.battery.policy import BATTERY_WINDOW
from tests.battery.streams import READERS
from tests.plugins.standin import RunningStandIn

VALID = 12  # examples per format in the default run
INVALID = 12
SEED = int(os.environ.get("BATTERY_SEED", "36"))


def examples(default: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Hypothesis' settings for a battery test: BATTERY_EXAMPLES examples (else
    `default`), drawn from BATTERY_SEED, no deadline (each is a real exchange)."""
    chosen = settings(
        max_examples=battery_examples(default),
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )

    def apply(test: Callable[..., None]) -> Callable[..., None]:
        return seed(SEED)(chosen(test))

    return apply


# Each exchange takes well under a second, even on a loaded machine.
TIMEOUT = 120 + 3 * battery_examples(max(VALID, INVALID))
pytestmark = pytest.mark.timeout(TIMEOUT)


Battery = tuple[Serve, requests.Session, Format]


@pytest.fixture(params=sorted(FORMATS))
def battery(
    request: pytest.FixtureRequest,
    make_standin_thread: Callable[[StandInOptions], RunningStandIn],
    redis_url: str,
    redis_key_prefix: str,
    tmp_path: Path,
    cloud_credentials: Path,
) -> Iterator[Battery]:
    """The stand-in, and serve in front of it with the proxy's own cloud credentials
    (the stand-ins' test ones: AWS keys, a service account whose token endpoint is the
    stand-in's) in its environment."""
    standin = make_standin_thread(StandInOptions(windows={"*": BATTERY_WINDOW}, max_recorded=None))
    write_service_account(cloud_credentials, standin.url + TOKEN_PATH)
    with serve(standin, redis_url, redis_key_prefix, tmp_path) as running:
        with requests.Session() as client:
            yield running, client, FORMATS[request.param]
        deadline = time.monotonic() + 30  # summaries made ahead of the last examples
        while any(r.status is None for r in standin.recorded) and time.monotonic() < deadline:
            time.sleep(0.1)
        for r in standin.recorded:
            # Every summariser call is one the upstream takes (but those an upstream
            # failure was asked for: test_an_upstream_failure_leaves_the_conversation_sound).
            if r.headers.get(PURPOSE) and '"fault"' not in header(r, "x-stand-in"):
                assert r.status == 200, r.error
    log = running.log_text()
    for mark in UNHANDLED:
        assert mark not in log, log[log.index(mark) - 2000 : log.index(mark) + 2000]


def mine(ex: Exchange, marker: str) -> Exchange:
    """What was sent for this example (a summary of an earlier one may arrive in its
    time): the requests holding its marker."""
    sent = [r for r in ex.sent if marker.encode() in r.body]
    return Exchange(ex.status, ex.headers, ex.answer, sent)


def test_valid_conversations_are_answered_and_kept_exactly(battery: Battery) -> None:
    running, client, fmt = battery
    done: list[str] = []  # what compaction did to each example

    @examples(VALID)
    @given(conversations())
    def one(c: Conversation) -> None:
        raw, spans = encode(fmt.render(c), c.style)
        ex = exchange(client, running, fmt, raw)
        check_valid(fmt, raw, byte_exact(c, spans), ex)
        done.append(ex.headers.get("x-compaction-strategy", "none"))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


def test_valid_conversations_streamed_read_as_the_api_streams(battery: Battery) -> None:
    """The same conversations asked for as a stream (each way the API has): what the
    client reads is a stream of that API, event by event, adding up to an answer in its
    shape; read rounds (stubs are read) merged into it unseen."""
    running, client, fmt = battery
    done: list[str] = []

    @examples(VALID)
    @given(conversations(), st.sampled_from(STREAMS[fmt.name]))
    def one(c: Conversation, way: Streamed) -> None:
        raw, spans = encode(way.body(fmt.render(c)), c.style)
        ex = exchange(client, running, fmt, raw, way.path)
        if ex.status == 200:
            answer, errored = READERS[fmt.name, way.name](ex.raw)
            assert not errored, ex.raw[-2000:]
            ex = dataclasses.replace(ex, answer=answer)
        check_valid(fmt, raw, byte_exact(c, spans), ex)
        done.append(ex.headers.get("x-compaction-strategy", "none"))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


def _asked(
    client: requests.Session, running: Serve, fmt: Format, c: Conversation, way: Streamed | None
) -> str:
    """One conversation asked (whole, or streamed `way`) and checked as valid; what
    compaction did to it."""
    render = fmt.render if way is None else (lambda c: way.body(fmt.render(c)))
    raw, spans = encode(render(c), c.style)
    tag = c.question.encode()
    ex = exchange(client, running, fmt, raw, way.path if way else "", tag)
    if way is not None and ex.status == 200:
        answer, errored = READERS[fmt.name, way.name](ex.raw)
        assert not errored, ex.raw[-2000:]
        ex = dataclasses.replace(ex, answer=answer)
    check_valid(fmt, raw, byte_exact(c, spans), ex)
    return ex.headers.get("x-compaction-strategy", "none")


def _ways(fmt: Format) -> st.SearchStrategy[Streamed | None]:
    return st.sampled_from([None, *STREAMS[fmt.name]])


def test_a_conversation_growing_turn_by_turn(battery: Battery) -> None:
    """An agent's session: the conversation sent again after each of its turns, each
    request the last one and a turn more (its line's state, checkpoints and reuse, read
    and written each time), each whole or streamed: every one answered and kept exactly."""
    running, client, fmt = battery
    done: list[str] = []

    @examples(VALID // 3)
    @given(conversations(), st.data())
    def one(c: Conversation, data: st.DataObject) -> None:
        for n in range(1, len(c.turns) + 1):
            turn = dataclasses.replace(c, turns=c.turns[:n], question=f"{c.question} t{n}")
            done.append(_asked(client, running, fmt, turn, data.draw(_ways(fmt))))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


FORKS = 3


def test_forks_of_one_conversation_at_once(battery: Battery) -> None:
    """A branching agent: forks of one conversation (its history, each its own newest
    turn) sent at the same time, whole or streamed, after the conversation itself; each
    answered and kept exactly, whatever the others did to the line's state."""
    running, _, fmt = battery
    done: list[str] = []

    @examples(VALID // 2)
    @given(conversations(), st.lists(_ways(fmt), min_size=FORKS, max_size=FORKS))
    def one(c: Conversation, ways: list[Streamed | None]) -> None:
        with requests.Session() as client:
            done.append(_asked(client, running, fmt, c, None))
        forks = [dataclasses.replace(c, question=f"{c.question} fork{k}") for k in range(FORKS)]

        def ask(k: int) -> str:
            with requests.Session() as client:
                return _asked(client, running, fmt, forks[k], ways[k])

        with ThreadPoolExecutor(FORKS) as pool:
            done.extend(pool.map(ask, range(FORKS)))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


WHOLE_FAULTS = ("eof", "500", "429", "529")
STREAM_FAULTS = ("eof", "eof_mid", "stream_error", "500", "429")


def test_an_upstream_failure_leaves_the_conversation_sound(battery: Battery) -> None:
    """The upstream fails a conversation's request (an error status; a whole answer cut;
    a stream cut, or ended by the API's error event, after its first delta: its read
    rounds' too): the client is told in the API's shape or sees the upstream's cut, and the
    same conversation asked again is answered and kept exactly (nothing the failure left
    in the line's state spoils it)."""
    running, client, fmt = battery
    done: list[str] = []

    @examples(VALID)
    @given(conversations(), _ways(fmt), st.data())
    def one(c: Conversation, way: Streamed | None, data: st.DataObject) -> None:
        fault = data.draw(st.sampled_from(WHOLE_FAULTS if way is None else STREAM_FAULTS))
        render = fmt.render if way is None else (lambda c: way.body(fmt.render(c)))
        raw, _ = encode(render(c), c.style)
        script = {"x-stand-in": orjson.dumps({"read_result": True, "fault": fault}).decode()}
        try:
            ex = exchange(client, running, fmt, raw, way.path if way else "", extra=script)
        except requests.exceptions.ChunkedEncodingError:
            pass  # a cut stream reaches the client cut
        else:
            # A 5xx is the upstream's own, passed on, or a 502 for its answer cut before
            # the client's began.
            theirs = ex.status in {r.status for r in ex.sent}
            cut_whole = ex.status == 502 and fault == "eof"
            assert ex.status < 500 or theirs or cut_whole, ex.raw[:500]
            if ex.status != 200:
                assert_error(fmt, ex.answer)
            elif way is not None:
                READERS[fmt.name, way.name](ex.raw)  # its events in order up to the end
        done.append(_asked(client, running, fmt, c, way))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


def test_a_client_gone_mid_stream_leaves_the_conversation_sound(battery: Battery) -> None:
    """The client goes away a few bytes into a slow stream: the same conversation asked
    again is answered and kept exactly."""
    running, client, fmt = battery

    @examples(VALID // 2)
    @given(conversations(), st.sampled_from(STREAMS[fmt.name]), st.integers(1, 400))
    def one(c: Conversation, way: Streamed, read: int) -> None:
        raw, _ = encode(way.body(fmt.render(c)), c.style)
        script = orjson.dumps({"read_result": True, "token_delay": 0.02, "chunk_tokens": 1})
        headers = {**fmt.headers, **STUB_READ, "x-stand-in": script.decode()}
        with requests.post(
            running.url + way.path, data=raw, headers=headers, stream=True, timeout=60
        ) as response:
            next(response.raw.stream(read), b"")
        _asked(client, running, fmt, c, way)

    one()


def test_broken_requests_are_never_rewritten_nor_summarised(battery: Battery) -> None:
    running, client, fmt = battery
    name = fmt.name
    breakers = sorted(MUTATIONS[name]) + sorted(BYTE_MUTATIONS) + ["deep_nesting"]

    @examples(INVALID)
    @given(conversations(), st.sampled_from(breakers))
    def one(c: Conversation, breaker: str) -> None:
        body = fmt.render(c)
        if breaker == "deep_nesting":  # valid, but deeper than orjson writes
            raw, _ = encode(deep_input(body))  # (its bytes: DEEP_BYTES, compact)
            check_odd(fmt, raw, DEEP_BYTES, mine(exchange(client, running, fmt, raw), c.marker))
            return
        if breaker in MUTATIONS[name]:
            body = MUTATIONS[name][breaker](body)
        raw, _ = encode(body, c.style)
        if breaker in BYTE_MUTATIONS:
            raw = BYTE_MUTATIONS[breaker](raw)
        check_invalid(fmt, raw, mine(exchange(client, running, fmt, raw), c.marker))

    one()
