"""The benchmark's prompts, shipped in benchmarks/data/ so a run depends on nothing outside the project:
the six Spec-Bench categories of the DuoDecoding paper (first turns; 128 new tokens, 32 for QA and RAG)
and hetspec's own for base models (code and text to continue, 64; HumanEval-style stubs, 128)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources

# The paper's column order (Tables 1-3), with the short column titles it uses.
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")
CONTINUATIONS = ("code", "continuation", "stubs")   # run when asked for (--categories)
ALL_CATEGORIES = CATEGORIES + CONTINUATIONS
TITLES = {"mt_bench": "MT", "translation": "Trans.", "summarization": "Sum.", "qa": "QA",
          "math_reasoning": "Math", "rag": "RAG", "code": "Code", "continuation": "Cont.", "stubs": "Stubs"}
MAX_NEW_TOKENS = {"mt_bench": 128, "translation": 128, "summarization": 128, "qa": 32,
                  "math_reasoning": 128, "rag": 32, "code": 64, "continuation": 64, "stubs": 128}


@dataclass(frozen=True)
class Prompt:
    category: str          # one of CATEGORIES (the file, not Spec-Bench's finer MT-bench labels)
    question_id: int
    text: str              # the first turn
    max_new_tokens: int

    @property
    def key(self) -> str:
        return f"{self.category}/{self.question_id}"


def load_prompts(categories=CATEGORIES, limit: int | None = None, max_new_tokens: int | None = None) -> list[Prompt]:
    """The first `limit` questions (all if None or 0) of each category, in file order, so that --limit N
    always picks the same prompts; `max_new_tokens` overrides the per-category budget."""
    if unknown := [c for c in categories if c not in ALL_CATEGORIES]:
        raise ValueError(f"unknown category {unknown[0]!r}; known: {', '.join(ALL_CATEGORIES)}")
    return [Prompt(c, int(row["question_id"]), row["turns"][0], max_new_tokens or MAX_NEW_TOKENS[c])
            for c in categories for row in _read(c)[:limit or None]]


def tokenized(prompts, tokenizer, chat: bool | None = None) -> tuple[bool, dict[str, list[int]]]:
    """(whether the chat template is used, each prompt's ids by key): the template's user message where `chat`,
    by default where the tokenizer has one; else the plain text."""
    chat = bool(tokenizer.backend is not None and tokenizer.chat_template) if chat is None else chat
    return chat, {p.key: tokenizer.encode_chat([{"role": "user", "content": p.text}]) if chat
                  else tokenizer.encode_prompt(p.text) for p in prompts}


def _read(category: str) -> list[dict]:
    source = "continuation" if category in CONTINUATIONS else "spec-bench"
    folder = resources.files("hetspec.benchmarks").joinpath("data").joinpath(source)
    text = folder.joinpath(f"{category}.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
