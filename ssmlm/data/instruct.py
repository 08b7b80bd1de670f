"""Instruction-tuning pairs {"prompt", "response"} (Birdie App. A.2: FLAN, then OpenHermes-2.5).

A source is a local file or a hub dataset. A local file is JSON Lines (one record a line) or a JSON list of
records; each record is in one of the common layouts, converted to a prompt/response pair:

- {"prompt", "response"}                                       (ours)
- {"instruction", "input", "output"}                           (Alpaca): prompt = instruction, blank line, input
- {"inputs", "targets"} or {"inputs", "target"}                (FLAN collection dumps)
- {"conversations": [{"from": "human" | "gpt", "value"}, ...]} (ShareGPT / OpenHermes): the first human turn
  is the prompt, the first gpt turn after it the response; system turns and later turns are left out.

Hub sources are named by an alias (`HUB`) or an owner/name id; their rows go through the same conversion.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssmlm.data.qa import subset
from ssmlm.errors import DataError, UserError

# alias -> hub dataset id. "flan": a parquet mirror of a FLAN collection sample (columns inputs / target,
# 373k rows, train split only); the paper's FLAN is the full collection (Longpre et al., 2023), far too large to
# name here, and the best-known mirror (Muennighoff/flan) is a loading script, which `datasets` >= 4 refuses.
HUB = {"flan": "AlexWortega/flan", "openhermes": "teknium/OpenHermes-2.5"}

_HUMAN, _GPT = ("human", "user"), ("gpt", "assistant")


def _text(record: dict, key: str) -> str:
    value = record.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"field '{key}' is {type(value).__name__}, expected a string")
    return value


def _from_conversation(turns) -> tuple[str, str]:
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        raise ValueError('\'conversations\' must be a list of {"from", "value"} turns')
    who = [str(t.get("from", "")).lower() for t in turns]
    human = next((i for i, w in enumerate(who) if w in _HUMAN), None)
    if human is None:
        raise ValueError("the conversation has no human turn")
    gpt = next((i for i in range(human + 1, len(turns)) if who[i] in _GPT), None)
    if gpt is None:
        raise ValueError("the conversation has no gpt turn after its first human turn")
    return _text(turns[human], "value"), _text(turns[gpt], "value")


def to_pair(record) -> dict[str, str]:
    """One record, in any layout of the module doc, as {"prompt", "response"}; ValueError saying what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if "conversations" in record:
        p, r = _from_conversation(record["conversations"])
    elif "prompt" in record and "response" in record:
        p, r = _text(record, "prompt"), _text(record, "response")
    elif "instruction" in record and "output" in record:
        extra = _text(record, "input")
        p = _text(record, "instruction") + (f"\n\n{extra}" if extra.strip() else "")
        r = _text(record, "output")
    elif "inputs" in record and ("targets" in record or "target" in record):
        p, r = _text(record, "inputs"), _text(record, "targets" if "targets" in record else "target")
    else:
        raise ValueError(
            f"unknown layout (keys {sorted(record)}): expected prompt/response, instruction/input/output, "
            "inputs/targets or conversations"
        )
    if not p.strip() or not r.strip():
        raise ValueError(f"empty {'prompt' if not p.strip() else 'response'}")
    return {"prompt": p, "response": r}


def read_pairs(path: str | Path) -> list[dict[str, str]]:
    """Every record of a local .jsonl / .json file as a pair; a bad record is a DataError naming FILE:LINE."""
    p = Path(path).expanduser()
    text = p.read_text(encoding="utf-8")
    if p.suffix == ".json" and text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except ValueError as e:
            raise DataError(f"{p}: not a JSON list of records ({e})") from None
        located = [(f"record {i}", rec) for i, rec in enumerate(records)]
    else:
        located = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                located.append((n, json.loads(line)))
            except ValueError as e:
                raise DataError(f"{p}:{n}: not a JSON object ({e})") from None
    pairs = []
    for where, record in located:
        try:
            pairs.append(to_pair(record))
        except ValueError as e:
            raise DataError(f"{p}:{where}: {e}") from None
    if not pairs:
        raise DataError(f"{p}: no records")
    return pairs


def _hub_pairs(name: str, split: str, limit: int | None, seed: int) -> list[dict[str, str]]:
    from ssmlm.data.hub import offline_reason
    from ssmlm.data.sources import quiet_datasets, root_cause

    offline = offline_reason()
    with quiet_datasets() as datasets:
        try:
            ds = datasets.load_dataset(name, split=split)
        except Exception as e:
            why = offline or root_cause(e)[:120]
            alias = next((a for a, n in HUB.items() if n == name), None)
            what = f"'{alias}' ({name}, {split})" if alias else f"'{name}' ({split})"
            raise UserError(
                f"instruction data {what} is not available from the hub ({why}): pass a local .jsonl/.json file of "
                "prompt/response records as the source instead"
            ) from None
    # subsample before converting: the hub sets are large (OpenHermes-2.5: 1M conversations)
    rows = subset(range(len(ds)), limit, seed)
    pairs = []
    for i, row in zip(rows, (ds if limit is None else ds.select(rows)).to_list(), strict=True):
        try:
            pairs.append(to_pair(row))
        except ValueError as e:
            raise DataError(f"{name} ({split}) row {i}: {e}") from None
    return pairs


def load_pairs(source: str, split: str = "train", limit: int | None = None, seed: int = 0) -> list[dict[str, str]]:
    """Instruction pairs from ``source``: a local .jsonl/.json file (``split`` ignored), a `HUB` alias ("flan",
    "openhermes") or a hub dataset id (owner/name). ``limit``: a seeded random subset of that many pairs, kept in
    file order, the same for the same seed."""
    path = Path(source).expanduser()
    if path.is_file():
        return subset(read_pairs(path), limit, seed)
    if source in HUB or ("/" in source and not path.suffix and not source.startswith((".", "/", "~"))):
        return _hub_pairs(HUB.get(source, source), split, limit, seed)
    raise UserError(
        f"instruction data '{source}': no such file, and not a hub dataset (aliases: {', '.join(HUB)}, or owner/name)"
    )
