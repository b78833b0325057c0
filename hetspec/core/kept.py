"""A converted copy kept on disk: transformers takes tens of seconds to turn a
GGUF file into a model or a tokenizer, and a kept copy loads in one or two.
The engine side keeps tokenizers, the target worker models, the same way."""
from __future__ import annotations

import os
import shutil


def load_or_convert(folder: str, load, convert, save):
    """load(folder) the copy kept in folder, if there is one that loads; else convert(),
    and keep it (save(value, path)) for next time, under a private name then renamed,
    so that a reader never sees half a copy and of two processes converting at once
    one copy wins. Keeping is best effort: a full disk or a read-only cache only costs
    the next start its conversion again. folder "": keep nothing."""
    if folder and os.path.isdir(folder):
        try:
            return load(folder)
        except Exception:  # noqa: BLE001 - an unreadable copy: convert again and replace it
            shutil.rmtree(folder, ignore_errors=True)
    value = convert()
    if folder:
        partial = f"{folder}.partial-{os.getpid()}"
        try:
            save(value, partial)
            os.rename(partial, folder)
        except Exception:  # noqa: BLE001 - keeping a copy is optional; converting already succeeded
            shutil.rmtree(partial, ignore_errors=True)
    return value
