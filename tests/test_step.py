"""A step as a unit, with no processes (scheduler/batch.py): Batch.plan gives each
running request its part (a lone request its own kind's, Decoder.own_part), and
commit applies the target's verdict on it. The
verdicts are the target's own tokens where the parts ask for them, written out from a
rule that stands in for the target's greedy choice: the next token is a function of the
context. Whatever joins and leaves, whatever the budget, every request commits exactly
that rule's tokens, and no batch's step holds more than its tokens and rows. The links
are real but connected to no worker: nothing here sends a command (the requests go
without the draft, so a lone one's kinds send none either; a batch's drafts are written
into the parts as the draft's reply would be)."""
from __future__ import annotations

import dataclasses
import functools
import time

import numpy as np
import pytest

from hetspec.config import load_config
from hetspec.core.params import SamplingParams
from hetspec.ipc.messages import GenerateRequest, WorkerHello
from hetspec.models import resolve_model
from hetspec.scheduler.batch import Batch, Drafts
from hetspec.scheduler.clients import Pending
from hetspec.scheduler.decoding.acceptance_prior import AcceptancePrior
from hetspec.scheduler.decoding.decoder import Decoder
from hetspec.scheduler.decoding.links import DraftLink, TargetLink
from hetspec.scheduler.decoding.request import Capabilities
from hetspec.scheduler.decoding.round import Draft, Verification, Window
from hetspec.scheduler.resolve import Resolver
from hetspec.scheduler.slots import Slots
from hetspec.scheduler.tokenizer import Tokenizer

VOCAB = 256
CAPS = Capabilities(max_gamma=8, max_sequences=1, borrow_cores=False, alone_borrows_cores=False,
                    draft_borrows_cores=False, keep_drafting=False, kv_handover=False, lookup=8)


def target_token(context: np.ndarray) -> int:
    """The stand-in target's greedy choice after `context`: a loop of 7 tokens after a
    prompt-specific start, so that prompt lookup guesses right once the loop repeats."""
    return int((context[-1] * 3 + 1) % 7 + 40) if len(context) > 1 else 40


@functools.cache
def resolver() -> Resolver:
    config = load_config({"draft": {"backend": "torch", "model": "random"}, "target": {"model": "random"}})
    return Resolver(Tokenizer(resolve_model("random")), VOCAB, frozenset(), 4, measured=False, cross_vocab=False,
                    decoding=config.decoding, server=config.server, acceptance=AcceptancePrior())


def admit(slots: Slots, rid: int, prompt: list[int], max_new: int, draft: DraftLink | None = None, **params):
    """A request admitted; without `draft`, one that goes without the draft."""
    params = {"max_new_tokens": max_new, **params}
    pending = Pending(b"client", GenerateRequest(rid, prompt, params=params), SamplingParams.make(params))
    request, output = resolver().resolve(pending)
    caps = dataclasses.replace(CAPS, batch_drafts=draft is not None)
    return slots.admit(lambda cache: Decoder(request, caps, draft or DraftLink("draft", None), TargetLink("target", None),
                                             output, without_draft=None if draft else "none in this test",
                                             cache=cache, client=pending))


def step(batch_tokens: int, rows: int) -> Batch:
    """A step whose draft drafts for no batch (the draft's part: tests/test_batch.py)."""
    return Batch(None, batch_tokens, rows, Drafts(DraftLink("draft", None), None, 8, lambda: True, batches=False))


def verdict(part) -> Verification:
    """The target's choice at each of the part's answer rows: after the context up to
    each of its last `rows` tokens."""
    context = np.concatenate([part.decoder.out.context[:part.keep], part.tokens])
    ends = range(len(context) - part.rows + 1, len(context) + 1)
    return Verification(np.array([target_token(context[:end]) for end in ends], np.int32), None, 0.01)


def expected(prompt: list[int], n: int) -> list[int]:
    context = list(prompt)
    for _ in range(n):
        context.append(target_token(np.array(context)))
    return context[len(prompt):]


def run_steps(slots: Slots, batch: Batch, arrivals: dict[int, list], limit: int = 400) -> dict[int, list[int]]:
    """Steps until every request is done; arrivals[k]: the requests that join before step k."""
    done, faults = {}, []
    for k in range(limit):
        for rid, prompt, max_new in arrivals.get(k, []):
            admit(slots, rid, prompt, max_new)
        if not slots.running and k > max(arrivals):
            return done
        parts = batch.plan(list(slots.running), lambda r, exc: faults.append((r, exc)))
        assert not faults, faults
        if not batch.alone:                    # (alone, a request reads the rest of its prompt at once)
            assert sum(len(p.tokens) for p in parts) <= batch.batch_tokens
            assert sum(p.rows for p in parts) <= batch.rows
        assert len({p.decoder.cache for p in parts}) == len(parts)
        for part in parts:
            batch.commit(part, verdict(part))
            if part.decoder.out.done:
                done[part.decoder.client.id] = part.decoder.out.new_ids
                slots.remove(part.decoder)
    raise AssertionError(f"not done after {limit} steps: {[r.client.id for r in slots.running]}")


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_every_request_commits_the_targets_own_tokens(n):
    """n requests at once, prompts of different lengths: chunks, first tokens, lookup guesses."""
    prompts = {rid: [rid + 1] * (3 + 11 * rid) for rid in range(n)}
    slots, batch = Slots(8, 0.05), step(batch_tokens=24, rows=40)
    done = run_steps(slots, batch, {0: [(rid, p, 20 + rid) for rid, p in prompts.items()]})
    assert done == {rid: expected(p, 20 + rid) for rid, p in prompts.items()}
    assert sorted(slots.free) == list(range(8))


def test_requests_join_and_leave_between_steps():
    """Arrivals at several steps, short and long requests: a slot freed is taken again."""
    arrivals = {0: [(0, [5, 6, 7], 40), (1, [9] * 30, 4)], 2: [(2, [1, 2], 12)], 3: [(3, [3] * 70, 8)],
                9: [(4, [8, 8], 30), (5, [4] * 5, 1)]}
    slots, batch = Slots(3, 0.05), step(batch_tokens=16, rows=24)
    pending = {k: list(v) for k, v in arrivals.items()}
    # three slots: a request that finds none waits for one (as Scheduler._admit does)
    done, queue, faults = {}, [], []
    for k in range(300):
        queue += pending.pop(k, [])
        while queue and slots.may_admit():
            admit(slots, *queue.pop(0))
        if not slots.running and not queue and not pending:
            break
        parts = batch.plan(list(slots.running), lambda r, exc: faults.append(exc))
        assert len(parts) <= 3 and (batch.alone or sum(len(p.tokens) for p in parts) <= 16)
        for part in parts:
            batch.commit(part, verdict(part))
            if part.decoder.out.done:
                done[part.decoder.client.id] = part.decoder.out.new_ids
                slots.remove(part.decoder)
    assert not faults
    assert done == {rid: expected(p, m) for v in arrivals.values() for rid, p, m in v}


def test_decoding_requests_come_first_and_share_the_rows():
    """A step's decoding requests take their parts before a prompt is read; each one's
    guess shrinks to its share of the rows as the batch grows."""
    slots, batch = Slots(8, 0.05), step(batch_tokens=64, rows=12)
    loop = [40] + expected([40], 30)              # the loop repeats: lookup guesses long windows
    decoding = [admit(slots, rid, loop, 40) for rid in range(4)]
    for r in decoding:
        r.read = len(r.out.context)
        r.first_token(Verification(np.array([target_token(r.out.context)]), None, 0.0))
    reader = admit(slots, 9, [7] * 100, 4)
    parts = batch.plan(list(slots.running), lambda r, exc: pytest.fail(str(exc)))
    assert [p.decoder for p in parts[:4]] == decoding and parts[4].decoder is reader
    assert all(len(p.guess) >= 1 for p in parts[:4])
    assert sum(p.rows for p in parts) <= 12 and max(len(p.tokens) for p in parts[:4]) <= 12 // 5
    assert parts[4].keep == 0 and len(parts[4].tokens) == 64 - sum(len(p.tokens) for p in parts[:4])


def test_a_part_that_raises_is_left_out_and_the_others_step():
    slots, batch = Slots(4, 0.05), step(batch_tokens=32, rows=32)
    good, bad = admit(slots, 0, [3, 4, 5], 6), admit(slots, 1, [6, 7], 6)
    for r in (good, bad):
        r.read = len(r.out.context)
        r.first_token(Verification(np.array([target_token(r.out.context)]), None, 0.0))

    def broken(limit=None):
        raise RuntimeError("its lookup failed")
    bad.guess = broken
    faults = []
    parts = batch.plan(list(slots.running), lambda r, exc: faults.append((r, str(exc))))
    assert [p.decoder for p in parts] == [good] and faults == [(bad, "its lookup failed")]
    batch.commit(parts[0], verdict(parts[0]))
    assert good.out.new_ids == expected([3, 4, 5], len(good.out.new_ids))


def test_a_lone_request_admits_another_once_its_turn_is_over():
    """Slots.may_admit: room, and a request alone for turn_s at least (or none running)."""
    slots = Slots(2, turn_s=3600)
    first = admit(slots, 0, [1, 2], 4)
    assert slots.may_admit()                       # admitted, not yet run alone: another may join it
    slots.last, slots.alone_since = first, (time.monotonic(), 0)
    assert not slots.may_admit()                   # alone, its turn not over
    slots.turn_s = 0.001
    time.sleep(0.002)
    assert not slots.may_admit()                   # turn_s over, but no round yet: only its prompt
    first.rounds_alone += 1
    assert slots.may_admit()
    admit(slots, 1, [3], 4)
    assert not slots.may_admit()                   # no slot left


def test_a_batchs_pipelined_rounds_commit_the_targets_own_tokens_whatever_the_draft_proposes():
    """Requests whose draft caches hold their context take DuoDecoding's round in a batch
    (Drafts.windows, Decoder.duodec_round): each step verifies the window drafted beside the
    last (Part.drafted, written here as DraftBatch's reply would be), right for two requests
    and wrong after its first token for the third, beside a fourth in mode target. Each commits the target's
    own tokens; the right drafts are kept."""
    link = DraftLink("draft", None)
    link.hello = WorkerHello("draft", 0, VOCAB, "cpu", [0], 1, 0.0, caches=8)
    slots, batch = Slots(8, 0.05), Batch(None, 48, 48, Drafts(link, None, 8, lambda: True, batches=True))
    prompts = {rid: [rid + 1] * (4 + 5 * rid) for rid in range(3)}
    requests = [admit(slots, rid, p, 30, link, speculation="always", gamma=4) for rid, p in prompts.items()]
    for r in requests:
        link.held[r.cache] = r.out.context     # a cache that holds its prompt
    other = admit(slots, 3, [9] * 3, 60, mode="target")   # outlives them (alone, they would draft now)
    done = {}
    while any(r in slots.running for r in requests):
        for part in batch.plan(list(slots.running), lambda r, exc: pytest.fail(str(exc))):
            if part.next_window is not None:   # the draft's reply: what each cache now holds, and its window
                context, gamma, _ = part.next_window
                link.held[part.decoder.cache] = context
                tokens = expected(list(context), gamma if part.decoder.id != 2 else 1) + [0] * gamma
                part.drafted = Draft([np.array(tokens[:gamma], np.int32)], None, 0.0)
            batch.commit(part, verdict(part))
            if part.decoder.out.done:
                done[part.decoder.client.id] = part.decoder.out.new_ids
                slots.remove(part.decoder)
    assert done == {rid: expected(p, 30) for rid, p in prompts.items()}
    assert other.out.new_ids == expected([9] * 3, len(other.out.new_ids))
    assert [r.stats.accepted > 0 for r in requests] == [True, True, False]
    assert all(r.stats.batched_rounds > 0 and r.stats.spec_rounds > 0 for r in requests)
    assert [r.stats.rounds < 12 for r in requests] == [True, True, False]   # 4 tokens a step, or 1


@pytest.mark.parametrize("draft_agrees", [True, False])
def test_a_lone_round_verifies_the_pending_window_and_a_lookup_guess_in_one_pass(draft_agrees):
    """Decoder.duodec_round alone: the pending window, then a lookup guess after it (the loop
    repeats: prompt lookup knows it), in one pass. The target keeps both; the draft's next
    window (drafted after the pending one) is pending next only where it starts with what the
    guess and the target committed, and then from the first token not yet committed."""
    slots = Slots(2, 0.05)
    loop = [40] + expected([40], 20)
    r = admit(slots, 0, loop, 40, DraftLink("draft", None), speculation="always", gamma=3)
    r.read = len(r.out.context)
    r.first_token(Verification(np.array([target_token(r.out.context)]), None, 0.0))
    r.pending, r.pending_at = Window(np.array(expected(list(r.out.context), 2), np.int32)), r.out.length
    part = r.duodec_round()
    start = list(r.out.context)
    assert len(part.guess) > 2 and part.guess.tokens.tolist() == expected(start, len(part.guess))
    context = part.next_window.context
    assert context.tolist() == start + part.guess.tokens[:2].tolist()
    later = expected(list(context), len(part.guess) + 4)
    branch = later if draft_agrees else later[:1] + [0] * (len(later) - 1)
    part.drafted = Draft([np.array(branch, np.int32)], None, 0.0)
    part.finish(verdict(part))
    committed = len(part.guess) + 1
    assert r.out.new_ids == expected(loop, len(r.out.new_ids)) and r.out.length == len(start) + committed
    assert (r.stats.drafted, r.stats.accepted) == (2, 2)
    assert r.stats.round_lookup_guessed == r.stats.round_lookup_accepted == len(part.guess) - 2
    assert r.pending_at == r.out.length
    assert r.pending.tokens.tolist() == (later[committed - 2:] if draft_agrees else [])
