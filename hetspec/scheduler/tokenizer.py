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
    """UTF-8 bytes as tokens, for the tiny random test models (ids above 255 decode to nothing)."""

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


SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "mask_token", "sep_token", "cls_token")


class Tokenizer:
    """A model's tokenizer, run by `tokenizers` with its chat template in jinja2, as transformers'
    fast tokenizers are; transformers (slow to import) only converts a GGUF file's, once."""

    def __init__(self, model: ModelSpec):
        self.backend = None        # a tokenizers.Tokenizer; None: UTF-8 bytes (a random model's)
        if model.kind == "random" and model.random.get("tokenizer", "bytes") != "bytes":
            model = resolve_model(f"builtin:{model.random['tokenizer']}")   # a builtin model's tokenizer, lent
        elif model.kind == "random":
            self.byte = ByteTokenizer()
            return

        def convert():
            from transformers import AutoTokenizer
            try:
                if model.kind == "gguf":
                    return AutoTokenizer.from_pretrained(model.path, gguf_file=model.gguf_file)
                return AutoTokenizer.from_pretrained(model.path)
            except Exception as exc:  # noqa: BLE001 - transformers raises many kinds
                raise ConfigError(f"could not load the tokenizer of {model.file}: {exc}") from None

        # The kept copy is a fast tokenizer's files: tokenizer.json holds every rule.
        loaded = load_or_convert(kept_tokenizer(model), _read_kept, convert,
                                 lambda tokenizer, path: tokenizer.save_pretrained(path))
        self.backend, self.config, self.chat_template = \
            loaded if isinstance(loaded, tuple) else _from_transformers(loaded)
        self.special = {k: v["content"] if isinstance(v, dict) else v for k, v in self.config.items()
                        if k in SPECIAL and isinstance(v, (str, dict))}
        self._template = None

    @property
    def size(self) -> int | None:
        """Tokens, added ones included (None: bytes)."""
        return None if self.backend is None else self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_ids(self) -> set[int]:
        eos = self.special.get("eos_token") if self.backend is not None else None
        token = None if eos is None else self.backend.token_to_id(eos)
        return set() if token is None else {token}

    def encode_prompt(self, prompt: str) -> list[int]:
        """RequestError if the tokenizer rejects the text."""
        try:
            if self.backend is None:
                return self.byte.encode(prompt)
            return self.backend.encode(prompt, add_special_tokens=True).ids
        except Exception as exc:  # noqa: BLE001 - tokenizers raise many kinds; the text is the request's
            raise RequestError(f"the prompt could not be tokenized: {type(exc).__name__}: {exc}") from None

    def encode_chat(self, messages: list[dict]) -> list[int]:
        if self.backend is None or not self.chat_template:
            raise RequestError("this model's tokenizer has no chat template: send a plain prompt instead of messages")
        try:
            if self._template is None:
                self._template = _compile(self.chat_template)
            text = self._template.render(messages=messages, tools=None, documents=None, add_generation_prompt=True,
                                         **self.special)
        except Exception as exc:  # noqa: BLE001 - a template error is the request's fault
            raise RequestError(f"messages could not be rendered by the chat template: {exc}") from None
        return self.backend.encode(text, add_special_tokens=False).ids   # the template wrote the start tokens

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        if self.backend is None:
            return self.byte.decode(ids)
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up(text) if self.config.get("clean_up_tokenization_spaces") else text

    # ---- for a draft of another vocabulary (bridge.py) ----------------------------

    def vocabulary(self) -> dict | None:
        """Token -> id (None for UTF-8 bytes)."""
        return None if self.backend is None else self.backend.get_vocab(with_added_tokens=True)

    def encode_start(self) -> list[int]:
        """The tokens a prompt starts with before any text (a BOS, or nothing)."""
        return [] if self.backend is None else self.backend.encode("", add_special_tokens=True).ids

    def encode_text(self, text: str) -> list[int]:
        """Text in the middle of a sequence: no start tokens."""
        if self.backend is None:
            return self.byte.encode(text)
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_with_ends(self, text: str) -> tuple[list[int], list[int]]:
        """encode_text, and where in the text each token ends (-1: unsure; Anchor checks them)."""
        if self.backend is None:
            return self.byte.encode_with_ends(text)
        encoded = self.backend.encode(text, add_special_tokens=False)
        return list(encoded.ids), [int(end) for _, end in encoded.offsets]


def _read_kept(folder: str):
    """(tokenizers.Tokenizer, tokenizer_config.json, chat template or None) of a kept copy."""
    import json

    from tokenizers import Tokenizer as Backend

    backend = Backend.from_file(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    template = config.get("chat_template")
    if os.path.exists(path := os.path.join(folder, "chat_template.jinja")):
        with open(path, encoding="utf-8") as f:
            template = f.read()
    return backend, config, template


def _from_transformers(hf):
    """The same, from a tokenizer transformers converted (kept nowhere: HETSPEC_CACHE=off)."""
    config = {k: getattr(hf, k, None) for k in (*SPECIAL, "clean_up_tokenization_spaces")}
    return hf.backend_tokenizer, config, getattr(hf, "chat_template", None)


def _compile(template: str):
    """A chat template, compiled as transformers compiles it (a sandbox; its filters and globals)."""
    import json
    from datetime import datetime

    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


def _clean_up(text: str) -> str:
    """transformers' clean_up_tokenization, for tokenizers configured with it."""
    for before, after in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                          (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(before, after)
    return text


class IncrementalText:
    """Text of generated tokens, piece by piece: each step decodes a short window and holds
    back a piece that ends mid-character (a token may change how the one before renders)."""

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
