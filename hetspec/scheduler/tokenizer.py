"""Text <-> token ids for the scheduler: prompts, chat templates, streamed text.

Workers see token ids only; all text handling lives here, in one process.
"""
from __future__ import annotations

import os

from hetspec.core.errors import ConfigError, RequestError
from hetspec.core.kept import load_or_convert
from hetspec.ipc.specs import ModelSpec
from hetspec.models import resolve_model


class ByteTokenizer:
    """UTF-8 bytes as tokens (ids 0-255), for the tiny random test models that
    ship no tokenizer. Ids above 255 decode to nothing."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """Bytes, and after each the length of the text it completes (-1 mid-character)."""
        ids, ends = [], []
        for i, char in enumerate(text):
            data = char.encode("utf-8")
            ids.extend(data)
            ends.extend([-1] * (len(data) - 1) + [i + 1])
        return ids, ends


def kept_tokenizer(model: ModelSpec) -> str:
    """Where a model's tokenizer is kept once converted ("": nowhere, a random model's)."""
    return os.path.join(model.cache_dir, "tokenizer") if model.cache_dir else ""


class Tokenizer:
    def __init__(self, model: ModelSpec):
        self.hf = None
        if model.kind == "random" and model.random.get("tokenizer", "bytes") != "bytes":
            model = resolve_model(f"builtin:{model.random['tokenizer']}")   # a builtin model's tokenizer, lent
        elif model.kind == "random":
            self.byte = ByteTokenizer()
            return
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        def convert():
            try:
                if model.kind == "gguf":
                    return AutoTokenizer.from_pretrained(model.path, gguf_file=model.gguf_file)
                return AutoTokenizer.from_pretrained(model.path)
            except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
                raise ConfigError(f"could not load the tokenizer of {model.file}: {exc}") from None

        kept = kept_tokenizer(model)
        # The kept copy is a fast tokenizer's files (tokenizer.json holds every rule), which
        # the fast class reads as they were saved; AutoTokenizer would import torch (seconds).
        self.hf = load_or_convert(kept, PreTrainedTokenizerFast.from_pretrained, convert,
                                  lambda tokenizer, path: tokenizer.save_pretrained(path))

    @property
    def eos_token_ids(self) -> set[int]:
        if self.hf is None or self.hf.eos_token_id is None:
            return set()
        return {int(self.hf.eos_token_id)}

    def encode_prompt(self, prompt: str) -> list[int]:
        """RequestError if the tokenizer rejects the text (core.params.check_text
        already refused what UTF-8 cannot encode)."""
        try:
            if self.hf is None:
                return self.byte.encode(prompt)
            return list(self.hf(prompt)["input_ids"])
        except Exception as exc:  # noqa: BLE001 - tokenizers raise many kinds; the text is the request's
            raise RequestError(f"the prompt could not be tokenized: {type(exc).__name__}: {exc}") from None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if self.hf is None or not getattr(self.hf, "chat_template", None):
            raise RequestError("this model's tokenizer has no chat template: send a plain prompt instead of messages")
        try:
            ids = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise RequestError(f"messages could not be rendered by the chat template: {exc}") from None
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, ids) -> str:
        if self.hf is None:
            return self.byte.decode(ids)
        return self.hf.decode(ids, skip_special_tokens=True)

    # ---- for a draft of another vocabulary (bridge.py) ----------------------------

    def vocabulary(self) -> dict | None:
        """Token -> id (None for UTF-8 bytes)."""
        return None if self.hf is None else self.hf.get_vocab()

    def encode_start(self) -> list[int]:
        """The tokens a prompt starts with before any text (a BOS, or nothing)."""
        return [] if self.hf is None else list(self.hf("")["input_ids"])

    def encode_text(self, text: str) -> list[int]:
        """Text in the middle of a sequence: no start tokens."""
        if self.hf is None:
            return self.byte.encode(text)
        return list(self.hf(text, add_special_tokens=False)["input_ids"])

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """encode_text, and where in the text each token ends (-1 where unsure). An end
        is checked by decoding the tokens up to it before it is relied on (Anchor)."""
        if self.hf is None:
            return self.byte.encode_with_ends(text)
        encoded = self.hf(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(encoded["input_ids"]), [int(end) for _, end in encoded["offset_mapping"]]


class IncrementalText:
    """Text of generated tokens, piece by piece, without re-decoding everything.

    A token can end mid-character (byte fallback) or change how the previous
    one renders, so each step decodes a short window and holds back a piece
    that ends in an incomplete character (the vLLM approach)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]):
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-6:])
        self.prefix = max(len(self.ids) - 5, 0)
        self.read = len(self.ids)

    def flush(self) -> str:
        """Whatever is still held back, at the end of generation."""
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return after[len(before):] if len(after) > len(before) else ""

    def add(self, token: int) -> str:
        self.ids.append(token)
        before = self.tokenizer.decode(self.ids[self.prefix:self.read])
        after = self.tokenizer.decode(self.ids[self.prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        return ""
