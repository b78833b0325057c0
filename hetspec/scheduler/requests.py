"""A client's request (its parameters checked on arrival: clients.Pending) resolved
against the engine: its prompt tokenized, the engine's limits applied, and the
engine's choices for it (gamma, branches, seed)."""
from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from hetspec.core.errors import RequestError
from hetspec.core.params import SamplingParams
from hetspec.scheduler.acceptance_prior import GENERIC
from hetspec.scheduler.bridge import BridgedDraft
from hetspec.scheduler.clients import Pending
from hetspec.scheduler.output import Output


@dataclass(frozen=True)
class Request:
    """One request, resolved against the engine: its parameters (seed filled in)
    and the engine's choices for it."""
    id: int
    params: SamplingParams
    gamma: int
    sequences: int | str
    rebalance: bool            # gamma "auto": each round's length comes from the costs (CostModel)
    prior: float = GENERIC     # where the acceptance estimate starts (the engine's past requests)
    speculation: str = "auto"  # "always": never rest from speculating (gate.py)
    keyed: bool = False        # sampled by keyed draws (core/acceptance.py): seeded, or a draft of another
                               # vocabulary; its tokens then never depend on timing, nor on the draft

    @property
    def rule(self) -> str:
        """The acceptance rule (core/acceptance.py): "greedy", "keyed" or "unkeyed"."""
        return "greedy" if self.params.greedy else "keyed" if self.keyed else "unkeyed"


def resolve(pending: Pending, engine) -> tuple[Request, Output]:
    """(the request, its output) for `engine`, the Scheduler: the prompt tokenized,
    and the engine's limits applied; RequestError names what is wrong."""
    message, params = pending.message, pending.params
    decoding, server = engine.config.decoding, engine.config.server
    if message.messages is not None:
        prompt_ids = engine.tokenizer.encode_chat(message.messages)
    elif isinstance(message.prompt, str):
        prompt_ids = engine.tokenizer.encode_prompt(message.prompt)
    else:
        prompt_ids = list(message.prompt)
        if max(prompt_ids) >= engine.n_vocab:
            raise RequestError(f"token id {max(prompt_ids)} is outside the vocabulary (size {engine.n_vocab})")
    if not prompt_ids:
        raise RequestError("the prompt encodes to no tokens")
    if len(prompt_ids) >= server.max_context:
        raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                           f"{server.max_context} (prompt plus new tokens)")
    gamma = params.gamma or engine.gamma
    if gamma > decoding.max_gamma:
        raise RequestError(f"gamma {gamma} exceeds [decoding] max_gamma = {decoding.max_gamma}")
    sequences = params.sequences or decoding.sequences
    if sequences != "dynamic" and sequences > decoding.max_sequences:
        raise RequestError(f"sequences {sequences} exceeds [decoding] max_sequences = {decoding.max_sequences}")
    seed = params.seed if params.seed is not None else secrets.randbits(63)
    keyed = not params.greedy and (params.seed is not None or isinstance(engine.drafter, BridgedDraft))
    request = Request(message.request_id, dataclasses.replace(params, seed=seed), gamma, sequences,
                      rebalance=engine.costs is not None and not params.gamma,
                      speculation=params.speculation or decoding.speculation, keyed=keyed)
    request = dataclasses.replace(request, prior=engine.acceptance.prior(request))
    # max_new_tokens is a bound: the engine's per-request maximum and the context's room cap it
    max_new = min(params.max_new_tokens, server.max_new_tokens, server.max_context - len(prompt_ids))
    return request, Output(prompt_ids, max_new, engine.eos, list(params.stop), engine.tokenizer)
