"""Planted facts through a chat-heavy session: how many a long run through the proxy keeps.

The chat shape of bench/make_trace.py (160 turns of seeded reasoning full of identifiers,
300-character results: only folds help) with 30 facts planted in its first 15 turns, two a
turn, each a sentence put in the middle of that turn's reasoning: ports, file paths,
function and class names, settings, error codes, decisions with their reason. Each fact
has one string to check: the value an agent needs later (`port 9187`, `deploy/helm/values-eu.yaml`,
`1.62.1`).

The session runs live (real anthropic SDK, real proxy with its embedded Redis, the
stand-in upstream with a 200,000-token window, whose summariser writes notes on what it
is shown: proxy/testing/summary.py; `--summary-loss N` makes it drop every N-th
identifier it finds, as a lossy model would). At the end the harness counts the facts
whose check string is in the last request the proxy sent upstream (its messages: verbatim
turns or a summary), and the bill from the stand-in's records (every upstream request,
summariser calls included). `--baseline` also runs the same session direct to an
unlimited stand-in, for the cost ratio (cache model: input 1.0, write 1.25, read 0.1,
output 5.0).

    .venv/bin/python bench/facts.py --baseline
    .venv/bin/python bench/facts.py --policy keep_last=2,summary_max_tokens=2000

`--session results` is harder (issue 35): the facts are in tool results, not in what the
agent wrote. The same 160 turns of chat-shaped reasoning, at a 1M window (the built-in
policy otherwise: trigger 100,000, target 80,000, in-place summaries), each turn's Bash
call answered with a slice of real source (the Python standard library's, numbered like
Claude Code's Read: 1,000 to 24,000 characters, log-uniform), the 30 facts put two a
result in the first 15 results, each as a comment line in the middle of the slice. Those
results are offloaded as they age (a stub of their head), then folded. The stand-in's
summariser is attentive (`summary_keeps`): it keeps every fact it is shown whole and none
it is not. Counted: the facts in the last request, and those a ref it names can still
read back (read_result); `--baseline` runs the session unmanaged for the cost ratio.

    .venv/bin/python bench/facts.py --session results --baseline
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import sysconfig
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.make_trace import SHAPES, reasoning  # noqa: E402
from bench.replay import PURPOSE, WINDOW, records_bill, serve_standin, with_policy  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.core.offload import ref_for, refs_in  # noqa: E402
from proxy.core.tokens import default_counter  # noqa: E402
from proxy.server.app import start  # noqa: E402
from proxy.store import EmbeddedRedis  # noqa: E402
from proxy.testing.agent import run_agent  # noqa: E402
from proxy.testing.standin import RECORDED  # noqa: E402


@dataclass(frozen=True, slots=True)
class Fact:
    sentence: str  # what the agent wrote
    check: str  # what must still be there at the end


FACTS = (
    Fact("The metrics exporter listens on port 9187, not the default.", "port 9187"),
    Fact("Staging Redis was moved to port 6391 last week.", "port 6391"),
    Fact("The admin API serves TLS on port 18443 only.", "port 18443"),
    Fact(
        "Retention lives in config/ledger/retention.yaml and nowhere else.",
        "config/ledger/retention.yaml",
    ),
    Fact("The EU overrides are in deploy/helm/values-eu.yaml.", "deploy/helm/values-eu.yaml"),
    Fact("Key rotation is scripted in scripts/rotate_keys.sh.", "scripts/rotate_keys.sh"),
    Fact("The retry policy is in internal/queue/backoff.go.", "internal/queue/backoff.go"),
    Fact(
        "The bug is in reconcile_pending_refunds() which skips partial refunds.",
        "reconcile_pending_refunds",
    ),
    Fact("Shards are picked by computeShardKey() from the tenant id.", "computeShardKey"),
    Fact("flush_audit_buffer() must run before shutdown.", "flush_audit_buffer"),
    Fact("LedgerSnapshotWriter holds the lock during export.", "LedgerSnapshotWriter"),
    Fact("Batches are capped by LEDGER_MAX_BATCH set to 750.", "LEDGER_MAX_BATCH"),
    Fact("The import fails with ERR_SHARD_MISMATCH on tenant 42.", "ERR_SHARD_MISMATCH"),
    Fact("Decision: pin grpcio to 1.62.1 because 1.63.0 leaks file descriptors.", "1.62.1"),
    Fact(
        "Decision: keep the job timeout at 45 minutes because the EU backfill takes 38.",
        "45 minutes",
    ),
    Fact(
        "The flaky test is test_refund_window_edge in the ledger suite.", "test_refund_window_edge"
    ),
    Fact(
        "The failing CI run is https://ci.example.com/runs/77120.",
        "https://ci.example.com/runs/77120",
    ),
    Fact("The regression came in with commit 4be9f01c.", "4be9f01c"),
    Fact("The user's ticket is #5812 and it is marked urgent.", "#5812"),
    Fact("Workers run with a heap of 768 MiB after the last incident.", "768 MiB"),
    Fact(
        "Decision: write refunds through RefundOutbox because direct writes lost events.",
        "RefundOutbox",
    ),
    Fact("The feature flag ledger.strict_mode is off in production.", "ledger.strict_mode"),
    Fact(
        "The nightly export writes to s3://acme-ledger-exports/nightly/.",
        "s3://acme-ledger-exports/nightly/",
    ),
    Fact("Alerts go to the PagerDuty service PLEDGR7.", "PLEDGR7"),
    Fact("The schema migration is migrate_0047_refund_index.", "migrate_0047_refund_index"),
    Fact("Decision: no retries on HTTP 409 because they double-post payouts.", "HTTP 409"),
    Fact("The rate limit upstream is 120 req/s per tenant.", "120 req/s"),
    Fact("The on-call engineer for the ledger is dana.okafor.", "dana.okafor"),
    Fact("The replica lag alarm fires at 2500 ms.", "2500 ms"),
    Fact("The Postgres cluster is ledger-pg-eu-3.", "ledger-pg-eu-3"),
)
PER_TURN = 2


def planted(
    seed: int, low: int, high: int, facts: tuple[Fact, ...] = FACTS
) -> Callable[[int], str]:
    """The chat shape's reasoning, with facts put into the first turns (PER_TURN each),
    each at a seeded word boundary in the middle of the turn's text."""
    base = reasoning(seed, low, high)

    def text(turn: int) -> str:
        prose = base(turn)
        mine = facts[turn * PER_TURN : (turn + 1) * PER_TURN]
        if not mine:
            return prose
        words = prose.split(" ")
        rng = random.Random(seed * 7 + turn)
        for fact in mine:
            at = rng.randint(len(words) // 4, max(len(words) // 4, 3 * len(words) // 4))
            words.insert(at, fact.sentence)
        return " ".join(words)

    return text


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)


def kept(body: dict[str, Any], facts: tuple[Fact, ...] = FACTS) -> list[Fact]:
    """The facts whose check string is in the request's messages (any text in them)."""
    text = "\n".join(_strings(body.get("messages")))
    return [f for f in facts if f.check in text]


def last_agent_request(recorded: list[Any]) -> dict[str, Any]:
    calls = [
        r
        for r in recorded
        if r.path_qs.split("?")[0] == "/v1/messages" and not r.headers.get(PURPOSE)
    ]
    body: dict[str, Any] = orjson.loads(calls[-1].body)
    return body


# The results session: a 1M window (the built-in policy's trigger and target otherwise),
# results of real sizes, in characters (log-uniform), from the standard library's source.
RESULTS_WINDOW = 1_000_000
RESULT_CHARS = (1_000, 24_000)
PLANTED_RESULTS = len(FACTS) // PER_TURN


def _sources() -> list[Path]:
    """The standard library's larger modules, in a fixed order (the results' text)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = [p for p in stdlib.glob("*.py") if p.stat().st_size >= 2 * RESULT_CHARS[1]]
    return sorted(found, key=lambda p: p.name)


def result_texts(seed: int, turns: int, facts: tuple[Fact, ...] = FACTS) -> list[str]:
    """Each turn's tool result: a numbered slice of a standard library module (as Claude
    Code's Read shows a file), of a seeded size; the first results carry the facts,
    PER_TURN each, as comment lines at seeded lines in the middle half of the slice."""
    sources = _sources()
    out = []
    for turn in range(turns):
        rng = random.Random(seed * 1_000_003 + turn)
        low, high = RESULT_CHARS
        size = int(math.exp(rng.uniform(math.log(low), math.log(high))))
        path = rng.choice(sources)
        lines = path.read_text().splitlines()
        first = rng.randrange(len(lines) // 2)
        taken: list[str] = []
        for n, line in enumerate(lines[first:], first + 1):
            taken.append(f"{n:6}\t{line}")
            if sum(len(t) + 1 for t in taken) >= size:
                break
        mine = facts[turn * PER_TURN : (turn + 1) * PER_TURN]
        for fact in mine:
            at = rng.randint(len(taken) // 4, max(len(taken) // 4, 3 * len(taken) // 4))
            taken.insert(at, f"      \t# NOTE: {fact.sentence}")
        out.append(f"{path.name}\n" + "\n".join(taken))
    return out


def readable(
    body: dict[str, Any], results: list[str], facts: tuple[Fact, ...] = FACTS
) -> list[Fact]:
    """The facts not in the request's messages that a ref they name still reads back:
    the result the ref was made of holds them (read_result serves it whole)."""
    named = set(refs_in("\n".join(_strings(body.get("messages")))))
    behind = "\n".join(text for text in results if ref_for(text) in named)
    held = kept(body, facts)
    return [f for f in facts if f not in held and f.check in behind]


async def session(url: str, args: argparse.Namespace) -> list[Any]:
    """The agent's run (`args.session`: "chat", facts in its reasoning; "results", facts in
    its tool results) against `url`."""
    low, high = SHAPES["chat"][2]
    client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-bench", max_retries=0)
    if getattr(args, "session", "chat") == "results":
        results = result_texts(args.seed, args.turns)
        text, output = reasoning(args.seed, low, high), lambda turn, _: results[turn]
    else:
        text, output = planted(args.seed, low, high), None
    try:
        return await run_agent(
            client,
            turns=args.turns,
            result_chars=SHAPES["chat"][1],
            conversation=uuid.uuid4().hex,
            text=text,
            max_tokens=8_192,
            **({"output": output} if output else {}),
        )
    finally:
        await client.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    tools = args.session == "results"
    window = RESULTS_WINDOW if tools else WINDOW
    policy = ",".join(p for p in (f"window={window}" if tools else "", args.policy) if p)
    keeps = tuple(f.check for f in FACTS) if tools else ()
    with tempfile.TemporaryDirectory() as tmp:
        redis = EmbeddedRedis(Path(tmp) / "redis")
        redis_url = await redis.start()
        url, app, runner = await serve_standin(
            window, summary_loss=args.summary_loss, summary_keeps=keeps
        )
        settings = load_settings(
            None,
            environ={},
            overrides={"server.port": 0, "upstream.url": url, "store.redis_url": redis_url},
        )
        proxy = await start(with_policy(settings, policy))
        try:
            turns = await session(proxy.url, args)
        finally:
            await proxy.stop()
            await redis.stop()
        recorded = app[RECORDED]
        counter = default_counter()
        agent = [
            r for r in recorded if r.path_qs.split("?")[0] == "/v1/messages"
            and not r.headers.get(PURPOSE)
        ]  # fmt: skip
        last = last_agent_request(recorded)
        out["turns"] = len(turns)
        out["kept"] = kept(last)
        out["readable"] = readable(last, result_texts(args.seed, args.turns)) if tools else []
        out["largest"] = max(counter.count_request(orjson.loads(r.body)) for r in agent)
        out["rejected"] = sum(1 for r in recorded if r.status != 200)
        out["summaries"] = sum(1 for r in recorded if r.headers.get(PURPOSE) == "summary")
        out["cost"], out["requests"] = records_bill(app)
        out["folds"] = sum(
            1 for t in turns if t.headers.get("x-compaction-summary") in ("made", "ahead", "waited")
        )
        await runner.cleanup()
        if args.baseline:
            url, app, runner = await serve_standin(100_000_000)
            await session(url, args)
            out["baseline"], _ = records_bill(app)
            if args.trace is not None:  # the unmanaged requests, for bench/optimal.py
                with args.trace.open("wb") as f:
                    f.writelines(r.body + b"\n" for r in app[RECORDED])
            await runner.cleanup()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--session", choices=("chat", "results"), default="chat")
    parser.add_argument("--turns", type=int, default=SHAPES["chat"][0])
    parser.add_argument("--seed", type=int, default=12, help="of the reasoning and results")
    parser.add_argument("--policy", default="", help="built-in policy fields: keep_last=2,...")
    parser.add_argument("--summary-loss", type=int, default=0, help="stand-in drops every N-th")
    parser.add_argument("--baseline", action="store_true", help="also run unmanaged, for the ratio")
    parser.add_argument("--trace", type=Path, help="with --baseline: write its requests (JSONL)")
    args = parser.parse_args()
    out = asyncio.run(run(args))
    lost = [f.check for f in FACTS if f not in out["kept"] and f not in out["readable"]]
    behind = [f.check for f in out["readable"]]
    line = (
        f"answered {out['turns']}/{args.turns}, rejected {out['rejected']};"
        f" facts {len(out['kept'])}/{len(FACTS)} in the last request"
        + (f", {len(behind)} more through a ref it names ({', '.join(behind)})" if behind else "")
        + f" (lost: {', '.join(lost) or 'none'});"
        f" billed {out['cost']:,.0f} over {out['requests']} upstream requests;"
        f" summaries {out['summaries']}; folds {out['folds']}; largest {out['largest']:,}"
    )
    if "baseline" in out:
        line += f"; unmanaged {out['baseline']:,.0f}: {out['cost'] / out['baseline']:.3f}x"
    print(f"session {args.session}, policy [{args.policy or 'default'}] turns {args.turns}: {line}")


if __name__ == "__main__":
    main()
