"""Drafting across vocabularies: a draft whose tokenizer is not the target's.

Neither model ever sees the other's tokens; text is the common ground. Committed target tokens are decoded and
encoded by the draft's tokenizer (its cache keeps the longest common prefix, as for a shared vocabulary:
workers/draft/drafter.py); each drafted branch is decoded and encoded by the target's, a window of target tokens.
A translated window is only a proposal, so exactness never depends on the translation. The draft's distribution
lives in another vocabulary, so every request is keyed (Rule.KEYED): the target keeps a translated token only if it
is its own keyed draw (core/sampling.draw_keyed), and the draft proposes its likeliest tokens. Re-encoding the whole
context every round would cost milliseconds on a long prompt, so only the tail after an anchor is (Anchor).
"""
from __future__ import annotations

import numpy as np

from hetspec.core.errors import EngineStartError
from hetspec.core.sampling import GREEDY, Sampling
from hetspec.ipc.messages import BranchPlan
from hetspec.scheduler.decoding.links import DraftLink
from hetspec.scheduler.decoding.round import Draft
from hetspec.scheduler.tokenizer import Tokenizer

# Text every draft vocabulary must carry through unchanged, or it cannot propose the target's text.
PROBE = "The quick brown fox, 42 times: jumps over the lazy dog!\n\tdef f(x):\n    return x * 2  # {ok}"
LOOKBEHIND = 4     # draft tokens decoded before a branch, so the branch's first piece renders as in context
ADVANCE = 8        # target tokens past the anchor's lag before it moves (Anchor._advance)
SETTLED = 8        # ... its lag behind committed text: a token crossing the kept part's end is unlikely this far back


def describe_vocabularies(target: Tokenizer, draft: Tokenizer, n_target: int, n_draft: int) -> str | None:
    """None when draft and target share one vocabulary (the same tokens, the same ids); else how they differ."""
    if n_target == n_draft and target.vocabulary() == draft.vocabulary():
        return None
    return f"the draft has {n_draft} tokens, the target {n_target}" if n_target != n_draft else \
        "the draft and the target number their tokens differently"


def check_expressible(draft: Tokenizer, name: str) -> None:
    """A draft whose tokenizer loses text (unknown pieces, lower-casing) cannot propose it."""
    back = draft.decode(draft.encode_text(PROBE))
    if back != PROBE:
        at = next((i for i, (a, b) in enumerate(zip(back, PROBE)) if a != b), min(len(back), len(PROBE)))
        raise EngineStartError(
            f"the draft's tokenizer ({name}) cannot express the target's text: {PROBE[max(at - 10, 0):at + 10]!r} "
            f"comes back as {back[max(at - 10, 0):at + 10]!r}; choose a draft whose vocabulary covers plain text")


class Anchor:
    """The draft's tokens of a context's text, re-encoding only its tail. The kept part ends where a target and a draft
    token both end, at least `lag` target tokens back, so a rejected window (never longer) never reaches into it;
    behind committed text, which no context is shorter than later, SETTLED tokens back. Encoding the tail alone
    matches encoding the whole unless a token crosses that boundary, which one both tokenizers chose makes unlikely;
    if one does, the draft proposes worse, never wrongly."""

    def __init__(self, target: Tokenizer, draft: Tokenizer, lag: int):
        self.target, self.draft, self.lag = target, draft, lag
        self.start = np.asarray(draft.encode_start(), np.int32)   # the draft's own start tokens (a BOS), before any text
        self.reset()

    def reset(self) -> None:
        self.target_ids = np.zeros(0, np.int32)   # the target tokens behind the kept part
        self.draft_ids = self.start
        self.last = (np.zeros(0, np.int32), self.start)   # the last context asked for, and its draft tokens

    def __call__(self, context: np.ndarray, settled: bool = False) -> np.ndarray:
        """The draft's tokens of context; `settled`: it is committed text, which later contexts all extend, so the
        kept part may end SETTLED tokens back (a round's check of the draft's cache, before its windows' contexts)."""
        if np.array_equal(context, self.last[0]):   # asked again: a round's check, then its restart's window
            return self.last[1]
        n = len(self.target_ids)
        if len(context) < n or not np.array_equal(context[:n], self.target_ids):
            self.reset()
            n = 0
        tail = context[n:]
        text = self.target.decode(tail)
        pieces, ends = self.draft.encode_with_ends(text)
        ids = np.concatenate([self.draft_ids, np.asarray(pieces, np.int32)])
        self._advance(context, tail, text, pieces, ends, SETTLED if settled else self.lag)
        self.last = (context.copy(), ids)
        return ids

    def _advance(self, context, tail, text, pieces, ends, lag: int) -> None:
        """Move the kept part forward to a shared token boundary `lag` tokens back, once ADVANCE more are past it:
        every call encodes the tail, on the round's critical path, so it is kept short."""
        if len(tail) < lag + ADVANCE:
            return
        for cut in range(len(tail) - lag, max(len(tail) - lag - 2 * ADVANCE, 0), -1):
            head = self.target.decode(tail[:cut])
            if head.endswith("\ufffd") or not text.startswith(head):
                continue              # mid-character, or a piece that renders differently alone
            if len(head) in ends and self.draft.decode(pieces[:ends.index(len(head)) + 1]) == head:
                j = ends.index(len(head)) + 1
                self.target_ids = np.asarray(context[:len(context) - len(tail) + cut], np.int32)
                self.draft_ids = np.concatenate([self.draft_ids, np.asarray(pieces[:j], np.int32)])
                return


class BridgedDraft:
    """A DraftLink (and used as one) that takes and returns target tokens, for a draft of another vocabulary."""

    def __init__(self, link: DraftLink, target: Tokenizer, draft: Tokenizer, max_gamma: int, n_ctx: int,
                 n_vocab: int):
        self.link, self.target, self.tokenizer, self.n_vocab = link, target, draft, n_vocab
        self.anchor = Anchor(target, draft, lag=max_gamma + 8)
        self.room = n_ctx - 2 * max_gamma      # draft tokens a context may have: the window and branches need the rest
        self.context = np.zeros(0, np.int32)   # the draft tokens of the last command's context
        self.healed = ""                       # ... and the spaces left off its end (_to_draft)
        self.behind: tuple[list[int], str] = ([], "")   # ... its last tokens, and their text with those spaces

    @property
    def busy(self) -> bool:
        return self.link.busy

    def poll(self) -> bool:
        return self.link.poll()

    def settle(self) -> None:
        self.link.settle()

    def halt(self) -> None:
        self.link.halt()

    def start_prefill(self, request_id: int, cache: int, context, seed: int, reuse_cache: bool, borrow_cores: bool,
                      kv_length: int = 0) -> None:
        """kv_length is always 0: the draft cannot take a cache of another model's tokens."""
        self.link.start_prefill(request_id, cache, self._to_draft(context), seed, reuse_cache, borrow_cores)

    def finish_prefill(self) -> float:
        return self.link.finish_prefill()

    def to_prefill(self, cache: int, context, reuse_cache: bool) -> int:
        return self.link.to_prefill(cache, self.anchor(np.asarray(context, np.int32), settled=True), reuse_cache)

    def ready(self, cache: int, context) -> bool:
        return self.link.ready(cache, self.anchor(np.asarray(context, np.int32), settled=True))

    def forget(self, cache: int) -> None:
        self.link.forget(cache)

    def start_window(self, request_id: int, cache: int, context, gamma: int, sampling: Sampling,
                     branches: BranchPlan | None = None) -> None:
        """The draft proposes its likeliest tokens: the target keeps x only if it is its own keyed draw, with
        probability p(x) whatever the draft's distribution, so the likeliest is kept most often."""
        self.link.start_window(request_id, cache, self._to_draft(context), gamma, GREEDY, branches)

    def finish_window(self) -> Draft:
        """The draft's branches as target tokens, no longer than the draft's."""
        drafted = self.link.finish_window()
        behind, before = self.behind
        branches = []
        for branch in drafted.branches:
            text = self.tokenizer.decode(behind + [int(t) for t in branch])
            text = text[len(before):] if text.startswith(before) else ""
            ids = self.target.encode_text(text.rstrip("\ufffd")) if text else []
            beyond = next((i for i, t in enumerate(ids) if t >= self.n_vocab), len(ids))   # not the target's model
            branches.append(np.asarray(ids[:min(beyond, len(branch))], np.int32))
        return Draft(branches, None, drafted.seconds)

    def _to_draft(self, context) -> np.ndarray:
        ids = self.anchor(np.asarray(context, np.int32))
        if len(ids) > self.room:
            raise ContextTooLong(f"the context is {len(ids)} tokens in the draft's vocabulary, more than its cache "
                                 f"leaves room for ({self.room}); the target went on alone")
        # Token healing: a context ending in spaces ends where the draft's text rarely does (its tokens start with
        # the space: " return"), so they are left for the draft to write again and taken off its proposals.
        # Newlines are not healed: that commits fewer tokens a round.
        last = self.tokenizer.decode(ids[-1:]) if len(ids) > len(self.anchor.start) + 1 else ""
        self.healed = last if last and not last.strip(" ") else ""
        self.context = ids[:-1] if self.healed else ids
        behind = [int(t) for t in self.context[-LOOKBEHIND:]]     # for finish_window, while the draft drafts
        self.behind = (behind, self.tokenizer.decode(behind) + self.healed)
        return self.context


class ContextTooLong(Exception):
    """The draft's tokens of this context overflow its cache: the target goes on alone (Decoder.without_draft)."""
    role = "draft"

