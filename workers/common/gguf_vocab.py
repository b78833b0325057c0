"""A GGUF file's end-of-generation tokens, read from its own metadata by the rule of
llama.cpp's vocabulary (src/llama-vocab.cpp, llama_vocab::impl::load), so that the
native backends need no llama.cpp (llama-cpp-python is the extra "llama").

The rule: a token ends generation if its text is one of EOG_TEXTS, or it is the eos,
eot or eom token the metadata names (tokenizer.ggml.*_token_id; eos defaults by
tokenizer model, DEFAULT_EOS), or the fill-in-the-middle pad, repo or file-separator
token (named by the metadata, else the token with one of FIM_TEXTS' texts). Two
exceptions: <|end|> is not one in a vocabulary that also ends on <|call|> (or
<|calls|>) and <|return|> (or <|flush|>), and </s> is not one in a vocabulary that
ends on <|tool_response>. llama.cpp also looks eot and eom up by text when the
metadata names none, but every text it looks for is in EOG_TEXTS already.

Only the metadata is read, from a memory map: gguf's GGUFReader makes numpy objects of
every metadata value first (seconds for Gemma 3's 262,144 tokens).
"""
from __future__ import annotations

import mmap
import struct

from gguf import GGUF_MAGIC, GGUFValueType, Keys

EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",     # <｜end▁of▁sentence｜>, DeepSeek's
    "[e~[",
))
# When the metadata names none of these tokens, llama.cpp takes one with such a text.
FIM_TEXTS = {
    Keys.Tokenizer.FIM_PAD_ID: ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    Keys.Tokenizer.FIM_REP_ID: ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    Keys.Tokenizer.FIM_SEP_ID: ("<|file_sep|>",),
}
# tokenizer.ggml.model -> llama.cpp's eos when the file names none (2 for a model it does not list)
DEFAULT_EOS = {"llama": 2, "gpt2": 11, "hybriddna": 11, "whitespace": 11, "t5": 1, "plamo2": 2,
               "bert": None, "rwkv": None, "gemma4": None}
NO_VOCAB = ("no_vocab", "none")

_SCALARS = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
            GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
            GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
            GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
_LENGTH = struct.Struct("<Q")
_WANTED = {Keys.Tokenizer.MODEL, Keys.Tokenizer.LIST, Keys.Tokenizer.EOS_ID, Keys.Tokenizer.EOT_ID,
           Keys.Tokenizer.EOM_ID, *FIM_TEXTS}


def end_of_generation_tokens(path: str) -> list[int]:
    """The ids llama.cpp's llama_vocab_is_eog is true of, ascending."""
    meta = read_vocab_metadata(path)
    tokens = meta.get(Keys.Tokenizer.LIST)
    if meta.get(Keys.Tokenizer.MODEL) in NO_VOCAB or not tokens:
        return []
    ids: dict[str, int] = {}
    for i, text in enumerate(tokens):
        ids.setdefault(text, i)
    eog = {ids[text] for text in EOG_TEXTS if text in ids} | _named_tokens(meta, ids, len(tokens))
    return sorted(_less_exceptions(eog, tokens))


def _named_tokens(meta: dict, ids: dict[str, int], n_tokens: int) -> set[int]:
    """The fill-in-the-middle tokens and the eos, eot and eom tokens the metadata names (or
    llama.cpp's defaults for them), those in the vocabulary."""
    def named(key: str, default: int | None) -> int | None:
        """The id the metadata names under key if in the vocabulary, else the default if it is."""
        value = meta.get(key)
        if isinstance(value, int) and 0 <= value < n_tokens:
            return value
        return default if default is not None and default < n_tokens else None

    # llama.cpp takes the first FIM text its hash map yields; here the lowest id
    found = [named(key, min((ids[t] for t in texts if t in ids), default=None)) for key, texts in FIM_TEXTS.items()]
    found += [named(Keys.Tokenizer.EOS_ID, DEFAULT_EOS.get(meta.get(Keys.Tokenizer.MODEL), 2)),
              named(Keys.Tokenizer.EOT_ID, None), named(Keys.Tokenizer.EOM_ID, None)]
    return {i for i in found if i is not None}


def _less_exceptions(eog: set[int], tokens: list[str]) -> set[int]:
    """Without <|end|> where <|call|> and <|return|> (or their kin) end generation too, and
    without </s> where <|tool_response> does."""
    texts = {tokens[i] for i in eog}
    if "<|end|>" in texts and texts & {"<|call|>", "<|calls|>"} and texts & {"<|return|>", "<|flush|>"}:
        eog = {i for i in eog if tokens[i] != "<|end|>"}
    if "<|tool_response>" in texts and "</s>" in texts:
        eog = {i for i in eog if tokens[i] != "</s>"}
    return eog


def read_vocab_metadata(path: str) -> dict:
    """The metadata end_of_generation_tokens reads (the tokenizer model, its token texts,
    the special token ids), the rest walked past."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        walk = _Walk(data)
        magic, version, _n_tensors, n_values = walk.take("<IIQQ")
        if magic != GGUF_MAGIC or version not in (2, 3):
            raise ValueError(f"{path} is not a GGUF file of version 2 or 3")
        meta = {}
        for _ in range(n_values):
            key = walk.string()
            value = walk.value(walk.take("<I")[0], keep=key in _WANTED)
            if key in _WANTED:
                meta[key] = value
        return meta


class _Walk:
    """Reads little-endian GGUF values from a buffer, front to back."""

    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return values

    def string(self, keep: bool = True) -> str | None:
        (length,) = self.take("<Q")
        start, self.pos = self.pos, self.pos + length
        # llama.cpp compares bytes: undecodable ones stay distinct (surrogates)
        return self.data[start:self.pos].decode("utf-8", "surrogateescape") if keep else None

    def strings(self, count: int, keep: bool) -> list[str] | None:
        """An array of strings (a vocabulary's texts: the loop, the one hot spot, inlined)."""
        data, pos, length, out = self.data, self.pos, _LENGTH.unpack_from, []
        for _ in range(count):
            (n,) = length(data, pos)
            pos += 8 + n
            if keep:
                out.append(data[pos - n:pos].decode("utf-8", "surrogateescape"))
        self.pos = pos
        return out if keep else None

    def value(self, kind: int, keep: bool = True):
        if kind == GGUFValueType.STRING:
            return self.string(keep)
        if kind == GGUFValueType.ARRAY:
            item, count = self.take("<IQ")
            if item == GGUFValueType.STRING:
                return self.strings(count, keep)
            if item in _SCALARS and not keep:
                self.pos += count * struct.calcsize(_SCALARS[item])
                return None
            values = [self.value(item, keep) for _ in range(count)]
            return values if keep else None
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF metadata type {kind}")
        return self.take("<" + _SCALARS[kind])[0]
