"""Committed tokens of one request: where generation stops, and the text streamed so far. Tokens are committed one
at a time so that EOS, a stop string or the token budget ends generation exactly where a plain decoder would."""
from __future__ import annotations

import numpy as np

from hetspec.scheduler.tokenizer import IncrementalText, Tokenizer


class Output:
    def __init__(self, prompt_ids: list[int], max_new_tokens: int, eos_ids: set[int], stop: list[str] | None,
                 tokenizer: Tokenizer):
        self.n_prompt = len(prompt_ids)
        self.limit = max_new_tokens
        self._tokens = np.zeros(self.n_prompt + max_new_tokens, dtype=np.int32)
        self._tokens[:self.n_prompt] = prompt_ids
        self.length = self.n_prompt
        self.eos = eos_ids
        self.stop = stop or []
        self.detokenizer = IncrementalText(tokenizer, prompt_ids)
        self.text = ""
        self.finish_reason: str | None = None
        self._round_start = (self.n_prompt, 0)

    @property
    def context(self) -> np.ndarray:
        """Prompt plus committed tokens (a view: valid until the next commit)."""
        return self._tokens[:self.length]

    @property
    def new_ids(self) -> list[int]:
        return self._tokens[self.n_prompt:self.length].tolist()

    @property
    def remaining(self) -> int:
        return self.limit - (self.length - self.n_prompt)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def commit(self, tokens) -> bool:
        """Append tokens until a stop condition; True when generation is over."""
        for token in tokens:
            if self.done:
                break
            self._tokens[self.length] = token
            self.length += 1
            if int(token) in self.eos:
                self.finish_reason = "eos"
                continue
            before = len(self.text)
            self.text += self.detokenizer.add(int(token))
            if self._hit_stop_string(before):
                self.finish_reason = "stop"
            elif self.remaining == 0:
                self.finish_reason = "length"
        if self.finish_reason in ("eos", "length"):
            self.text += self.detokenizer.flush()
        return self.done

    def cancel(self, reason: str = "cancelled") -> None:
        """End here: the client asked to stop or went away ("cancelled"), or the deadline passed ("timeout")."""
        if not self.done:
            self.finish_reason = reason
            self.text += self.detokenizer.flush()

    def _hit_stop_string(self, new_from: int) -> bool:
        for stop in self.stop:
            at = self.text.find(stop, max(0, new_from - len(stop) + 1))
            if at >= 0:
                self.text = self.text[:at]
                return True
        return False

    def take_round(self) -> tuple[list[int], str]:
        """Tokens and text committed since the last call (streaming), holding back text that may begin a stop string."""
        start_tokens, start_text = self._round_start
        end_text = len(self.text) if self.done else len(self.text) - self._stop_prefix_length()
        end_text = max(end_text, start_text)
        self._round_start = (self.length, end_text)
        return self._tokens[start_tokens:self.length].tolist(), self.text[start_text:end_text]

    def _stop_prefix_length(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        longest = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:n]):
                    longest = n
                    break
        return longest
