"""SQuAD v2 as a generation task (Birdie §4.4, App. B): answerable questions only, asked as plain text.

Following Jelassi et al. (2024), as the paper does, the unanswerable v2 questions are dropped; the model is
neither finetuned on SQuAD nor given examples. An item is {id, context, question, answers: [gold strings]}.
"""

from __future__ import annotations

import random
from pathlib import Path

from ssmlm.data.squad import read_squad_json, squad_from_hub
from ssmlm.errors import DataError

# The official file of each split, as found in a --data-dir.
FILES = {"validation": "dev-v2.0.json", "dev": "dev-v2.0.json", "train": "train-v2.0.json"}


def prompt(item: dict) -> str:
    """The paper formats inputs as "context question" (§4.4) with no template; a blank line between."""
    return f"{item['context']}\n\n{item['question']}"


def _rows(data_dir: str | None, split: str) -> list[dict]:
    if data_dir is None:
        from ssmlm.data.hub import offline_reason

        try:
            return squad_from_hub(version_2=True, split="validation" if split == "dev" else split)
        except DataError:
            why = offline_reason() or f"could not load rajpurkar/squad_v2 ({split})"
            raise DataError(
                f"SQuAD v2 needs the hub or local files ({why}): pass --data-dir DIR with dev-v2.0.json"
            ) from None
    path = Path(data_dir).expanduser()
    if path.is_dir():
        if split not in FILES:
            raise DataError(f"SQuAD v2 split '{split}': expected one of {', '.join(FILES)}")
        path = path / FILES[split]
        if not path.is_file():
            raise DataError(f"--data-dir {data_dir}: no {FILES[split]} in it (the official SQuAD v2 {split} file)")
    elif not path.is_file():
        raise DataError(f"--data-dir {data_dir}: no such file or directory")
    return read_squad_json(path)


def _golds(texts: list[str]) -> list[str]:
    # the dev set repeats an answer once per annotator who gave it; the scores take a max, so keep each once
    return list(dict.fromkeys(t for t in texts if t.strip()))


def subset(items: list, limit: int | None, seed: int = 0) -> list:
    """A seeded random ``limit`` of ``items``, kept in their original order (all of them when limit is None)."""
    if limit is None or limit >= len(items):
        return list(items)
    if limit < 0:
        raise DataError(f"limit {limit}: expected a non-negative number of items")
    keep = sorted(random.Random(seed).sample(range(len(items)), limit))
    return [items[i] for i in keep]


def load_answerable(data_dir: str | None, split: str = "validation", limit: int | None = None, seed: int = 0):
    """The answerable SQuAD v2 questions of ``split``: from ``data_dir`` (a SQuAD JSON file, or a directory
    holding dev-v2.0.json / train-v2.0.json) or, when it is None, from the hub's rajpurkar/squad_v2.

    ``limit``: a random subset of that many items, the same for the same ``seed``.
    """
    items = []
    for row in _rows(data_dir, split):
        golds = _golds(row["answers"]["text"])
        if golds:
            items.append({"id": row["id"], "context": row["context"], "question": row["question"], "answers": golds})
    return subset(items, limit, seed)
