"""The scheduler's tokenizer (hetspec/scheduler/tokenizer.py) runs a kept tokenizer with
`tokenizers` and its chat template with jinja2, without transformers: on each shipped
file it encodes, decodes, renders chat and names its special tokens exactly as
transformers' fast tokenizer does with the same files."""
import subprocess
import sys

import pytest

from hetspec.core.errors import RequestError
from hetspec.models import resolve_model
from hetspec.scheduler.tokenizer import Tokenizer, kept_tokenizer

TEXTS = ["The capital of France is", "  def f(x):\n\treturn x ** 2  # twice\n", "naïve café, 東京, 🙂🙃, ½",
         "<|im_start|>user\nhi<|im_end|> and <bos> spelt out", "", " leading space", "a" * 300]
CHATS = [[{"role": "user", "content": "Write a haiku about the sea."}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+2?"},
          {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3? 🙂"}]]


@pytest.fixture(scope="module", params=["builtin:smollm2", "builtin:gemma3-270m"])
def pair(request):
    from transformers import PreTrainedTokenizerFast

    model = resolve_model(request.param)
    ours = Tokenizer(model)                         # converts and keeps the tokenizer the first time
    return ours, PreTrainedTokenizerFast.from_pretrained(kept_tokenizer(model))


def test_encodings_and_offsets_equal_transformers(pair):
    ours, theirs = pair
    for text in TEXTS:
        assert ours.encode_prompt(text) == theirs(text)["input_ids"], text
        ids, ends = ours.encode_with_ends(text)
        encoded = theirs(text, add_special_tokens=False, return_offsets_mapping=True)
        assert ids == encoded["input_ids"] and ends == [end for _, end in encoded["offset_mapping"]], text
    assert ours.encode_start() == theirs("")["input_ids"]


def test_decodings_special_tokens_and_vocabulary_equal_transformers(pair):
    ours, theirs = pair
    for text in TEXTS:
        ids = theirs(text)["input_ids"]
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
    assert ours.eos_token_ids == {theirs.eos_token_id}
    assert ours.size == len(theirs) and ours.vocabulary() == theirs.get_vocab()


def test_chat_templates_render_as_transformers_renders_them(pair):
    ours, theirs = pair
    if not theirs.chat_template:                    # Gemma 3 270M is a base model: none
        with pytest.raises(RequestError, match="no chat template"):
            ours.encode_chat(CHATS[0])
        return
    for chat in CHATS:
        expected = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        expected = expected["input_ids"] if hasattr(expected, "keys") else expected
        assert ours.encode_chat(chat) == list(expected)
    odd = [{"role": "user", "content": "x"}, {"role": "nobody"}]   # a template may refuse it, or render it
    try:
        expected = theirs.apply_chat_template(odd, add_generation_prompt=True, tokenize=True)
    except Exception:  # noqa: BLE001 - whatever it raises, ours is a RequestError naming the template
        with pytest.raises(RequestError, match="chat template"):
            ours.encode_chat(odd)
    else:
        assert ours.encode_chat(odd) == list(expected["input_ids"] if hasattr(expected, "keys") else expected)


def test_a_kept_tokenizer_loads_without_transformers(pair, tmp_path):
    """Importing transformers cost the scheduler 1.8 s and 80 MB: a kept copy needs none of it."""
    code = ("import sys; from hetspec.models import resolve_model; from hetspec.scheduler.tokenizer import Tokenizer; "
            "t = Tokenizer(resolve_model('builtin:smollm2')); t.encode_chat([{'role': 'user', 'content': 'hi'}]); "
            "t.decode(t.encode_prompt('hi')); print('transformers' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path)
    assert done.stdout.split() == ["False"]
