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
from pathlib import Path

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
    conversations,
    deep_input,
    encode,
)
from tests.battery.harness import (
    PURPOSE,
    UNHANDLED,
    Exchange,
    Serve,
    battery_examples,
    check_invalid,
    check_odd,
    check_valid,
    exchange,
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
            if r.headers.get(PURPOSE):  # every summariser call is one the upstream takes
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
        raw, spans = encode(fmt.render(c))
        ex = exchange(client, running, fmt, raw)
        check_valid(fmt, raw, spans, ex)
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
        raw, spans = encode(way.body(fmt.render(c)))
        ex = exchange(client, running, fmt, raw, way.path)
        if ex.status == 200:
            answer, errored = READERS[fmt.name, way.name](ex.raw)
            assert not errored, ex.raw[-2000:]
            ex = dataclasses.replace(ex, answer=answer)
        check_valid(fmt, raw, spans, ex)
        done.append(ex.headers.get("x-compaction-strategy", "none"))

    one()
    assert set(done) - {"none"}, "the battery's conversations are compacted"


def test_broken_requests_are_never_rewritten_nor_summarised(battery: Battery) -> None:
    running, client, fmt = battery
    name = fmt.name
    breakers = sorted(MUTATIONS[name]) + sorted(BYTE_MUTATIONS) + ["deep_nesting"]

    @examples(INVALID)
    @given(conversations(), st.sampled_from(breakers))
    def one(c: Conversation, breaker: str) -> None:
        body = fmt.render(c)
        if breaker == "deep_nesting":  # valid, but deeper than orjson writes
            raw, _ = encode(deep_input(body))
            check_odd(fmt, raw, DEEP_BYTES, mine(exchange(client, running, fmt, raw), c.marker))
            return
        if breaker in MUTATIONS[name]:
            body = MUTATIONS[name][breaker](body)
        raw, _ = encode(body)
        if breaker in BYTE_MUTATIONS:
            raw = BYTE_MUTATIONS[breaker](raw)
        check_invalid(fmt, raw, mine(exchange(client, running, fmt, raw), c.marker))

    one()
