"""One whole DuoDecoding round through the real workers: verify a pending window while the draft
drafts the next, then accept and pick a branch; each repeat rolls back as a rejection does. It should
cost about the larger of test_draft_step x gamma and test_verify_pass[gamma+1], plus a little."""
from __future__ import annotations

import numpy as np
import pytest

from hetspec.benchmarks.micro.conftest import GAMMA
from hetspec.core.acceptance import accept_greedy
from hetspec.core.branches import pick_branch
from hetspec.core.sampling import GREEDY
from hetspec.ipc.messages import BranchPlan

DECODING = {"gamma": GAMMA, "sequences": "dynamic"}      # the scheduler fixture's [decoding]


@pytest.fixture(scope="module")
def primed(scheduler, context_ids):
    """Both workers hold the context; the draft's window after it is pending."""
    context = np.asarray(context_ids, dtype=np.int32)
    scheduler.target.start_verify(1, 0, context, 0, 1, GREEDY)
    scheduler.target.finish_verify(1)
    scheduler.draft.start_window(1, 0, context, GAMMA, GREEDY)
    window = scheduler.draft.finish_window().branches[0]
    return context, window


def test_duodec_round(benchmark, scheduler, primed):
    context, window = primed
    target, draft_link = scheduler.target, scheduler.draft
    max_sequences = scheduler.config.decoding.max_sequences

    def one_round():
        target.start_verify(1, 0, np.concatenate([context[-1:], window]), len(context) - 1, len(window) + 1, GREEDY)
        draft_link.start_window(1, 0, np.concatenate([context, window]), GAMMA, GREEDY,
                                BranchPlan("dynamic", max_sequences, 0.8))
        verification = target.finish_verify(len(window) + 1)
        draft = draft_link.finish_window()
        accepted, token = accept_greedy(window, verification.choice)
        return accepted, pick_branch(draft.branches, token), len(draft.branches)

    benchmark.extra_info.update(gamma=GAMMA, context=len(context), window=len(window))
    accepted, branch, branches = benchmark(one_round)
    benchmark.extra_info.update(accepted=accepted, branches=branches, branch_hit=branch is not None)
    assert 0 <= accepted <= len(window)
