"""A client's request resolved against the engine, once: its prompt tokenized, the limits
applied, and the engine's choices for it (gamma, branches, seed, the acceptance rule)."""
from __future__ import annotations

import dataclasses
import secrets
from dataclasses import dataclass

from hetspec.config import DecodingConfig, ServerConfig
from hetspec.core.branches import DYNAMIC
from hetspec.core.errors import RequestError
from hetspec.core.params import SamplingParams
from hetspec.core.sampling import Rule, Sampling
from hetspec.scheduler.clients import Pending
from hetspec.scheduler.decoding.acceptance_prior import AcceptancePrior
from hetspec.scheduler.decoding.output import Output
from hetspec.scheduler.decoding.request import Request
from hetspec.scheduler.tokenizer import Tokenizer


@dataclass(frozen=True)
class Resolver:
    """What resolving needs of the engine, fixed at start-up (but the acceptance history)."""
    tokenizer: Tokenizer
    n_vocab: int
    eos: frozenset[int]
    gamma: int                 # the engine's draft budget (measured, or the config's)
    measured: bool             # gamma "auto": a request without its own gamma follows the costs
    cross_vocab: bool          # a draft of another vocabulary: every sampled request is keyed
    decoding: DecodingConfig
    server: ServerConfig
    acceptance: AcceptancePrior

    def resolve(self, pending: Pending) -> tuple[Request, Output]:
        """(the request, its output); RequestError names what is wrong."""
        params = pending.params
        prompt_ids = self._tokens(pending)
        gamma = params.gamma or self.gamma
        if gamma > self.decoding.max_gamma:
            raise RequestError(f"gamma {gamma} exceeds [decoding] max_gamma = {self.decoding.max_gamma}")
        sequences = params.sequences or self.decoding.sequences
        if sequences != DYNAMIC and sequences > self.decoding.max_sequences:
            raise RequestError(f"sequences {sequences} exceeds [decoding] max_sequences = {self.decoding.max_sequences}")
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        request = Request(pending.id, dataclasses.replace(params, seed=seed), self._sampling(params, seed), gamma,
                          sequences, rebalance=self.measured and not params.gamma,
                          speculation=params.speculation or self.decoding.speculation)
        request = dataclasses.replace(request, prior=self.acceptance.prior(request))
        # max_new_tokens is a bound: the engine's per-request maximum and the context's room cap it
        max_new = min(params.max_new_tokens, self.server.max_new_tokens, self.server.max_context - len(prompt_ids))
        return request, Output(prompt_ids, max_new, self.eos, list(params.stop), self.tokenizer)

    def _tokens(self, pending: Pending) -> list[int]:
        message = pending.message
        if message.messages is not None:
            prompt_ids = self.tokenizer.encode_chat(message.messages)
        elif isinstance(message.prompt, str):
            prompt_ids = self.tokenizer.encode_prompt(message.prompt)
        else:
            prompt_ids = list(message.prompt)
            if max(prompt_ids) >= self.n_vocab:
                raise RequestError(f"token id {max(prompt_ids)} is outside the vocabulary (size {self.n_vocab})")
        if not prompt_ids:
            raise RequestError("the prompt encodes to no tokens")
        if len(prompt_ids) >= self.server.max_context:
            raise RequestError(f"the prompt has {len(prompt_ids)} tokens; the context holds "
                               f"{self.server.max_context} (prompt plus new tokens)")
        return prompt_ids

    def _sampling(self, params: SamplingParams, seed: int) -> Sampling:
        """Greedy at temperature 0; keyed draws for a seed (the tokens are the target alone's)
        or another vocabulary's draft (whose distribution the target cannot weigh); else unkeyed."""
        if params.greedy:
            return Sampling(Rule.GREEDY)
        rule = Rule.KEYED if params.seed is not None or self.cross_vocab else Rule.UNKEYED
        return Sampling(rule, params.temperature, params.top_k, params.top_p, seed)
