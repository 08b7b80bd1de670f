"""Tokenizers, trained on the corpus with `tokenizers` or loaded from a file.

Encoders (``data.tokenizer_type: wordpiece``): every tokenizer has the BERT special tokens and adds [CLS] …
[SEP] (and [SEP] between pair segments) itself, so a trained tokenizer behaves like the bert-large-uncased one
the BiGS models use.

Language models (``byte_bpe``): a byte-level BPE, whose decode gives back exactly the text encoded (generation
and the evaluations compare decoded text), with the reserved tokens of ssmlm.data.reserved added as special
tokens. A loaded tokenizer.json (e.g. a 32,000-token Llama-2-style vocabulary) gets the reserved tokens
appended if it lacks them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from ssmlm.data.reserved import PAD, RESERVED, START
from ssmlm.errors import DataError

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _bert_pipeline(tok: Tokenizer, lowercase: bool) -> Tokenizer:
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase or None)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


def _add_post_processor(tok: Tokenizer) -> Tokenizer:
    # A freshly trained WordPiece has no post-processor: without this it would emit no [CLS]/[SEP].
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def train_wordpiece(
    lines: Iterable[str] | Callable[[], Iterable[str]], vocab_size: int, lowercase: bool = True
) -> Tokenizer:
    """A WordPiece trained on ``lines``, the same file for the same lines on every call.

    `tokenizers`' trainer (a BPE trainer with the "##" continuation prefix) numbers each "##c" piece in the
    order it meets it while iterating a hash map of the corpus' words, and that order changes with every
    process; merges of equal count are then taken in order of those ids, so the vocabulary, not only its
    numbering, can change (huggingface/tokenizers#1794). A first pass stopped before any merge (vocabulary
    size 0) finds every "##c" piece; the real pass is given them as special tokens in code-point order, which
    fixes their ids, and they are then made ordinary vocabulary entries again. ``lines`` is read twice: pass a
    function that opens it again to keep a streamed corpus streamed (a one-shot iterator is kept in memory).
    """
    if callable(lines):
        read = lines
    else:
        kept = lines if isinstance(lines, list | tuple) else list(lines)
        read = lambda: kept  # noqa: E731
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    tok.train_from_iterator(read(), trainer=_wordpiece_trainer(0, SPECIALS))
    continuing = sorted(t for t in tok.get_vocab() if t.startswith("##") and len(t) == 3)
    tok = _bert_pipeline(Tokenizer(models.WordPiece(unk_token="[UNK]")), lowercase)
    tok.train_from_iterator(read(), trainer=_wordpiece_trainer(vocab_size, SPECIALS + continuing))
    saved = json.loads(tok.to_str())
    saved["added_tokens"] = [t for t in saved["added_tokens"] if t["content"] in SPECIALS]
    return _add_post_processor(Tokenizer.from_str(json.dumps(saved)))


def _wordpiece_trainer(vocab_size: int, special_tokens: list[str]) -> trainers.WordPieceTrainer:
    return trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens, min_frequency=2, show_progress=False
    )


def load_tokenizer(path: str | Path, lowercase: bool = True) -> Tokenizer:
    """A vocab.txt (one WordPiece per line, as released with BERT) or a `tokenizers` tokenizer.json."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in ("tokenizer.json", "vocab.txt"):
            if (p / name).is_file():
                p = p / name
                break
    if not p.is_file():
        raise DataError(f"tokenizer '{path}': no such file (expected a vocab.txt or tokenizer.json)")
    try:
        if p.suffix == ".json":
            tok = Tokenizer.from_file(str(p))
        else:
            tok = _bert_pipeline(Tokenizer(models.WordPiece.from_file(str(p), unk_token="[UNK]")), lowercase)
    except Exception as e:
        raise DataError(f"tokenizer '{p}': could not be read: {str(e).splitlines()[0]}") from None
    missing = [s for s in SPECIALS if tok.token_to_id(s) is None]
    if missing:
        raise DataError(f"tokenizer '{p}': missing special tokens {missing}")
    return _add_post_processor(tok)


def special_ids(tok: Tokenizer) -> dict[str, int]:
    return {s.strip("[]").lower(): tok.token_to_id(s) for s in SPECIALS}


def train_byte_bpe(lines: Iterable[str], vocab_size: int, split_digits: bool = False) -> Tokenizer:
    """A byte-level BPE (GPT-2 style: every byte is in the base alphabet, so nothing is ever unknown), with
    <|pad|> as id 0 and the reserved tokens next. ``split_digits``: no merge ever joins a digit to anything (each
    digit one token, as in Llama-2's tokenizer); decoding still gives back the exact text."""
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if split_digits:
        byte_level = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    tok.pre_tokenizer = byte_level
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, *RESERVED],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    return tok


def load_lm_tokenizer(path: str | Path) -> Tokenizer:
    """A tokenizer.json for a language model, with the reserved tokens added (appended to its vocabulary)
    where missing."""
    p = Path(path).expanduser()
    if p.is_dir() and (p / "tokenizer.json").is_file():
        p = p / "tokenizer.json"
    if not p.is_file() or p.suffix != ".json":
        raise DataError(f"tokenizer '{path}': no such tokenizer.json (language models need a lossless tokenizer)")
    try:
        tok = Tokenizer.from_file(str(p))
    except Exception as e:
        raise DataError(f"tokenizer '{p}': could not be read: {str(e).splitlines()[0]}") from None
    missing = [t for t in RESERVED if tok.token_to_id(t) is None]
    if missing:
        tok.add_special_tokens(missing)
    return tok


def is_lm_tokenizer(tok: Tokenizer) -> bool:
    return tok.token_to_id(START) is not None


def lm_special_ids(tok: Tokenizer) -> dict[str, int]:
    """The ids a language model's data needs: pad (0 when the tokenizer has no pad token: padding is marked
    by segment id 0, not by its token) and start."""
    pad = tok.token_to_id(PAD)
    return {"pad": 0 if pad is None else pad, "start": tok.token_to_id(START)}
