"""Reserved tokens of the language-model objectives (Birdie; docs/faithfulness.md#birdie-objectives): added as
special tokens to whatever tokenizer an LM run uses, so they never collide with text and always decode to
themselves. Objectives take a {name: id} mapping of these (``reserved_ids``).
"""

from __future__ import annotations

# objective classes (the Birdie grid's explore classes); one paradigm token each
CLASSES = (
    "next_token",
    "prefix_lm",
    "infilling",
    "autoencoding",
    "deshuffling",
    "copying",
    "selective_copying",
)
NUM_SENTINELS = 100  # v1: ids 31900-31999 of the Llama-2 vocabulary re-purposed as sentinels

PAD = "<|pad|>"  # id 0 in a trained byte-level BPE (padding has segment id 0 whatever its token id)
START = "<|start|>"  # "begin generating": between a sample's prefix and its target
END = "<|end|>"  # ends a finetuning response (prompt/response data), so generation knows where to stop
SENTINELS = tuple(f"<|sentinel_{i}|>" for i in range(NUM_SENTINELS))
PARADIGMS = {c: f"<|paradigm_{c}|>" for c in CLASSES}
# selective copying's markers (paper A.5: [COPY] [START] [END] [CONTEXT] [SEP] [DONE])
COPY_MARKERS = {
    "copy": "<|copy|>",
    "span_start": "<|span_start|>",
    "span_end": "<|span_end|>",
    "context": "<|context|>",
    "sep": "<|sep|>",
    "done": "<|done|>",
}

RESERVED = (START, *SENTINELS, *PARADIGMS.values(), *COPY_MARKERS.values(), END)


def reserved_ids(token_to_id) -> dict[str, int]:
    """{token string: id} of every reserved token, from a tokenizer's ``token_to_id``."""
    ids = {t: token_to_id(t) for t in RESERVED}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise KeyError(f"tokenizer lacks reserved tokens {missing[:3]}{'…' if len(missing) > 3 else ''}")
    return ids
