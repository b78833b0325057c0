"""The benchmark's prompts, shipped in benchmarks/data/ so a run depends on nothing outside the project:
the six Spec-Bench categories of the DuoDecoding paper (first turns; 128 new tokens, 32 for QA and RAG)
and hetspec's own for base models (code and text to continue, 64; HumanEval-style stubs, 128).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

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
    prompts = []
    for category in categories:
        if category not in ALL_CATEGORIES:
            raise ValueError(f"unknown category {category!r}; known: {', '.join(ALL_CATEGORIES)}")
        rows = _read(category)[:limit or None]
        budget = max_new_tokens or MAX_NEW_TOKENS[category]
        prompts += [Prompt(category, int(row["question_id"]), row["turns"][0], budget) for row in rows]
    return prompts


def load_prompt_file(path: str, max_new_tokens: int | None = None, limit: int | None = None) -> list[Prompt]:
    """Prompts from a JSON-lines file of the shipped files' form ({"turns": [text, ...]},
    optionally "question_id"; or {"text": ...}), category "file"; 128 new tokens unless
    max_new_tokens says otherwise."""
    prompts = []
    for i, line in enumerate(Path(path).read_text("utf-8").splitlines()):
        if not line.strip():
            continue
        row = json.loads(line)
        turns = row.get("turns") if isinstance(row, dict) else None
        text = turns[0] if isinstance(turns, list) and turns else row.get("text") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}, line {i + 1}: a prompt needs \"turns\" (a list of texts) or \"text\"")
        prompts.append(Prompt("file", int(row.get("question_id", len(prompts) + 1)), text, max_new_tokens or 128))
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts[:limit or None]


def _read(category: str) -> list[dict]:
    source = "continuation" if category in CONTINUATIONS else "spec-bench"
    folder = resources.files("hetspec.benchmarks").joinpath("data").joinpath(source)
    text = folder.joinpath(f"{category}.jsonl").read_text("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]
