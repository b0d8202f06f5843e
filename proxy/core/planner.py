"""The rewrite planner: which step a request's history takes (docs/design.md#over-the-thresholds).

`plan` is a pure function of the request's messages, the conversation's checkpoint and
the policy (`PlanInput`, proxy/core/working.py). It decides, in this order:

- whether the conversation's checkpoint applies (not when this request cannot offer
  read_result under the name it holds: then it is planned alone, and stores nothing;
  nor when the store could not be read: then nothing it plans is stored either);
- whether to offload (over `offload_at`: every large result that has left the keep
  window becomes a stub, proxy/core/rewrites.py);
- under the trigger (moved up by a fold that could not reach it): the history goes as
  it is, or with its checkpoint; near it, the next fold's summary is made ahead;
- over it, the fold to the target (`FoldPlan`, its summariser's input assembled by
  proxy/core/summariser_input.py), completed at once with a summary made ahead when one
  covers it, put off while the window has room and that summary is still being made, or
  waited for at the wait point; when no fold can be made, a pack, else a refusal.

It answers with an outcome (proxy/core/outcome.py); a `FoldPlan` is completed by
`rewrites.fold` once the driver has its summary.
"""

from __future__ import annotations

import math
from dataclasses import replace

from proxy.core.checkpoint import Checkpoint
from proxy.core.commands import PreparedSummary
from proxy.core.digests import chain_hashes
from proxy.core.fold import plan_compaction
from proxy.core.history import compaction_turns, pinned_tokens
from proxy.core.outcome import FoldPlan, Planned, Recount, Refuse, Rewrite, Untouched
from proxy.core.rewrites import fold, offload, pack, rewrite_of
from proxy.core.strategy import Strategy
from proxy.core.summariser_input import folding, member_digests
from proxy.core.working import Limits, PlanInput, Working, limits_of, real, segments_for, working

# The offload step is decided with estimated counts while the working set and its margin
# stay under this share of where folds are planned (issue 34; nearer, a line whose offload
# steps fell otherwise than exact counts' had summaries made ahead for folds it did not
# take: tests/server/test_compaction_e2e.py under load).
ESTIMATED_OFFLOAD_SHARE = 0.5


def plan(inp: PlanInput) -> Planned:
    outcome = _plan(inp)
    if not inp.store_ok and isinstance(outcome, Rewrite) and outcome.checkpoint is not None:
        # Planned without the conversation's state (the store could not be read, a
        # timeout as often as an outage): it knows nothing of the line the store holds,
        # so saving it, the store answering again by then, would put a pack of the history
        # as sent (its summary gone) in that line's place for every later turn.
        return replace(outcome, checkpoint=None)
    return outcome


def _plan(inp: PlanInput) -> Planned:
    segments, applied = segments_for(inp.checkpoint, inp.digests)
    stored = inp.checkpoint if applied else None
    if stored is not None and stored.tool and inp.tool is None:
        # This request cannot take the conversation's rewrite (it cannot offer
        # read_result: several choices, say): plan it on its own and store nothing.
        return _alone(inp)
    if stored is not None and stored.tool and stored.tool != inp.tool:
        segments, stored = segments_for(None, inp.digests)[0], None  # the client took the name
    inp = replace(inp, sticky_tool=bool(stored is not None and stored.tool))
    limits = limits_of(inp)
    work = working(segments, inp)
    # What the client sent, not what an earlier rewrite made of it.
    before = real(sum(inp.counts), inp.factor)
    blobs: list[tuple[str, str]] = []
    offloading = bool(inp.tool and inp.store_ok and inp.offload_ok)
    unsure, estimated = work.unsure, work.estimated
    near = offloading and unsure and abs(work.tokens - limits.offload_at) <= unsure
    if near and work.tokens + unsure > limits.prepare_at * ESTIMATED_OFFLOAD_SHARE:
        # Within reach of where folds are planned, whether to offload is the exact
        # count's to say (what a fold takes, and its summary's key, follow from it).
        return Recount(estimated)
    # Short of that, the estimate's, even within its margin: a wrong call stubs the
    # results that left the keep window a turn early or late (nothing is lost:
    # read_result), while the working set, brought under the offload trigger by each
    # offload step, hovers at it, so exact counts would encode nearly every new result
    # (bench/RESULTS.md, "Offload decided by the estimate").
    if offloading and work.tokens > limits.offload_at:
        # An offload step: every large result that has left the keep window becomes a
        # stub, added after what is frozen (stubs already sent never change).
        # Under the trigger in batches (the policy's offload_batch, else the format's);
        # over it, all at once.
        batch = inp.policy.offload_batch or inp.dialect.offload_batch
        batch = batch if work.tokens <= limits.trigger else 1
        work, blobs = offload(work, inp, batch)
    unsure, estimated = work.unsure, work.estimated
    if unsure and work.tokens + unsure > limits.prepare_at:
        # Near or past where folds are planned (a summary made ahead, the fold, a pack):
        # which turns they take, and the keys they are stored under, are the exact
        # counts' to say.
        return Recount(estimated)
    if work.tokens <= _recross_at(limits, stored):
        quiet: Untouched | Rewrite
        if blobs:
            quiet = rewrite_of(
                inp, work, inp.tool, Strategy.OFFLOAD, before, blobs=blobs, limits=limits
            )
        elif stored is None:
            quiet = Untouched(before)
        else:
            quiet = rewrite_of(
                inp,
                work,
                stored.tool,
                Strategy.CHECKPOINT,
                before,
                checkpoint=False,
                limits=limits,
            )
        if inp.store_ok and work.tokens > limits.prepare_at:
            # The next fold's summary, made ahead unless one made (or being made) ahead
            # already folds its oldest groups: what the fold's summariser needs is built
            # only when it is to be asked.
            choice = _fold_choice(inp, work, limits)
            if choice is not None and _prefix_labels(inp.prepared, work, choice[0], inp) is None:
                ahead = folding(inp, work, limits, before, blobs, "", *choice)
                return replace(quiet, prepare=ahead)
        return quiet

    # Over the trigger: fold the oldest turns into a summary, else pack, to the target;
    # the outcome is frozen in a new checkpoint.
    reason = "" if inp.store_ok else "store_unavailable"
    if inp.tool is None and inp.store_ok:
        reason = "offload_off"
    planned = _fold_plan(inp, work, limits, before, blobs, reason)
    if planned is None:
        if inp.store_ok:
            reason = reason or "no_fold"
        return pack(inp, work, limits, before, blobs, reason)
    ready = inp.prepared
    if ready is not None and ready.text is not None:
        if ready.folds == planned.folds:
            return fold(replace(planned, key=ready.key), ready.text, summary="ahead")
        adopted = _adopted(planned, ready)
        if isinstance(adopted, Rewrite) and adopted.estimate <= limits.trigger:
            return adopted
    covered = _covers_a_prefix(ready, planned)
    if work.tokens <= limits.defer_at and not (covered and ready is not None and ready.failed):
        # Its summary is not ready: go on unfolded (the window still has room) and have
        # it made in the background, rather than make this turn wait for it. (When the
        # summariser failed at it, the fold asks for it now.)
        prepare = None if covered else planned
        if not blobs and stored is None:
            return Untouched(before, prepare=prepare, reason="summary_pending")
        strategy = Strategy.OFFLOAD if blobs else Strategy.CHECKPOINT
        tool = inp.tool if blobs or (stored is not None and stored.tool) else None
        deferred = rewrite_of(
            inp, work, tool, strategy, before, blobs=blobs, checkpoint=bool(blobs)
        )
        return replace(deferred, reason="summary_pending", prepare=prepare)
    if covered and ready is not None and ready.pending:
        # At the wait point with the summary of the oldest groups still being made
        # ahead: wait for that one (what is left of its call, paid once) rather than
        # have a second summary made now, when folding those groups is enough.
        awaited = _awaited(planned, ready)
        if awaited is not None:
            return awaited
    return planned


def _awaited(plan: FoldPlan, ready: PreparedSummary) -> FoldPlan | None:
    """The fold of the oldest groups whose summary (`ready`) is being made ahead, when
    folding them brings the history under the trigger even with a summary as large as
    the policy allows; else None (the whole fold makes its own summary)."""
    work, limits, inp = plan.work, plan.limits, plan.inp
    labels = _prefix_labels(ready, work, plan.fold, inp)
    if labels is None:
        return None
    kept = work.tokens - sum(g.tokens for g in work.groups if g.label in labels)
    room = limits.trigger - kept
    if room < math.ceil(inp.policy.summary_max_tokens / inp.factor):
        return None
    awaited = folding(
        inp, work, limits, plan.tokens_before, plan.blobs, plan.reason, labels, room, ahead=True
    )
    return replace(awaited, key=ready.key)  # where the summary being made ahead will be


def _fold_plan(
    inp: PlanInput,
    work: Working,
    limits: Limits,
    before: int,
    blobs: list[tuple[str, str]],
    reason: str,
) -> FoldPlan | None:
    """The fold that brings `work` to the target (seed 000), with what its summariser
    needs; None when the planner refuses (nothing to fold, no room for a summary)."""
    choice = _fold_choice(inp, work, limits)
    if choice is None:
        return None
    return folding(inp, work, limits, before, blobs, reason, *choice)


def _fold_choice(
    inp: PlanInput, work: Working, limits: Limits
) -> tuple[frozenset[str], int] | None:
    """Which groups that fold folds and the room its summary has; None as `_fold_plan`."""
    if not inp.store_ok:
        return None
    turns = compaction_turns(work.groups)
    budget = limits.target - pinned_tokens(work.groups)
    planned = plan_compaction(turns, budget, inp.policy.keep_last)
    if planned is None or not planned[0]:
        return None
    return frozenset(planned[0]), planned[2]


def _prefix_labels(
    prepared: PreparedSummary | None, work: Working, fold: frozenset[str], inp: PlanInput
) -> frozenset[str] | None:
    """The labels of the run of the fold's oldest groups that a summary made (or being
    made) ahead folds, its `folds` being that run's summary key; None when it folds no
    such run (it was made from what this history begins with: the planner is given no
    other)."""
    if prepared is None:
        return None
    folded = [g for g in work.groups if g.label in fold]
    runs = (member_digests(work.segments, g.members, inp.digests) for g in folded)
    for n, key in enumerate(chain_hashes(runs)):
        if key == prepared.folds:
            return frozenset(g.label for g in folded[: n + 1])
    return None


def _covers_a_prefix(prepared: PreparedSummary | None, plan: FoldPlan) -> bool:
    """Whether a summary made (or being made) ahead folds some oldest groups of `plan`."""
    return _prefix_labels(prepared, plan.work, plan.fold, plan.inp) is not None


def _adopted(plan: FoldPlan, ready: PreparedSummary) -> Rewrite | Refuse | None:
    """The fold of the oldest groups a summary made ahead covers (fewer than `plan`
    would fold: the turns since stay verbatim), or None when it covers none of them."""
    labels = _prefix_labels(ready, plan.work, plan.fold, plan.inp)
    if labels is None or ready.text is None:
        return None
    return fold(replace(plan, key=ready.key, fold=labels), ready.text, summary="ahead")


def without_blobs(inp: PlanInput) -> Planned:
    """The plan again after the crossing's writes failed: nothing offloaded (a stub whose
    blob was not kept could never be read), nothing to keep; a fold may still use the
    summary already made for it (the key does not depend on offloading)."""
    return plan(replace(inp, offload_ok=False, checkpoint=None))


def _alone(inp: PlanInput) -> Planned:
    """A plan for this request only: no checkpoint applied, nothing offloaded or stored."""
    outcome = plan(replace(inp, checkpoint=None, store_ok=False))
    if isinstance(outcome, Rewrite):
        return replace(outcome, checkpoint=None, alone=True, reason="", blobs=[])
    return outcome


def _recross_at(limits: Limits, stored: Checkpoint | None) -> int:
    """The history size that makes a new crossing: the trigger. A fold that landed above
    the target (its summary made ahead folded fewer turns) does not move it, nor the
    prepare and wait points with it. Only a checkpoint that could not get under the
    trigger at all (what cannot be dropped is larger) keeps the hysteresis from where it
    got to, so identical resends reuse it instead of compacting again every time."""
    if stored is None or not stored.strategy.folded or stored.tokens_after <= limits.trigger:
        return limits.trigger
    gap = limits.trigger - limits.target
    return min(limits.limit, max(limits.trigger, stored.tokens_after + gap))
