"""Text generation from a language-model run: the Python function the evaluations use, and what
`ssmlm generate` prints.

Where the prompt goes (``mode``): ``prefix`` puts it in the bidirectional prefix, then START, as Birdie
trains its prefix objectives (docs/faithfulness.md#birdie-layout); ``causal`` puts START first and the prompt after
it, as a next-token-only (clm) run was trained; ``auto`` picks causal for clm pretraining runs and prefix
otherwise (a finetuned run was trained with its prompts in the prefix, whatever its pretraining mixture).
The prompt is led by the paradigm token of the objective class it imitates (prefix LM or next token), as the
run's samples were (unless the run used ``objective.paradigm: none``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ssmlm.data.reserved import END, PARADIGMS, START
from ssmlm.errors import UserError
from ssmlm.models.decode import Sampling, generate_ids
from ssmlm.models.decode_limits import cache_bytes_per_token, check_new_tokens
from ssmlm.runs import Run, open_run

DECODE_WINDOW = 32  # streaming: tokens decoded afresh per token at most, once their text is settled


@dataclass
class Generator:
    """A loaded LM run, ready to generate from (loading once serves many prompts)."""

    run: Run
    model: object
    tokenizer: object
    mode: str
    step: int | None = None  # the checkpoint's training step

    def layout(self, prompt: str) -> tuple[list[int], list[int]]:
        """(prefix, causal) ids as the run's training samples were laid out: a prompt in the prefix is a prefix-LM
        sample, a causal one a next-token sample, each led by its class's paradigm token when the run used them."""
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        start = self.tokenizer.token_to_id(START)
        cls = "prefix_lm" if self.mode == "prefix" else "next_token"
        lead = [] if self.run.recipe.objective.paradigm == "none" else [self.tokenizer.token_to_id(PARADIGMS[cls])]
        return ([*lead, *ids], [start]) if self.mode == "prefix" else (lead, [start, *ids])

    def __call__(
        self,
        prompt: str,
        sampling: Sampling = Sampling(),
        stop: Sequence[str] = (),
        on_text: Callable[[str], None] | None = None,
    ) -> str:
        """The text generated after ``prompt``, cut before the first ``stop`` string (and END). ``on_text``, when
        given, receives the text as it comes, one call per generated token (a piece may be empty while its
        characters are incomplete or could begin a stop string); the pieces join to the returned text."""
        prefix, causal = self.layout(prompt)
        check_room(self.run.recipe.model, sampling.max_new_tokens, len(prefix) + len(causal), "max_new_tokens")
        dec = self.tokenizer.decode
        end = self.tokenizer.token_to_id(END)

        def stopped(ids: list[int]) -> bool:
            # END closes a finetuned response; only the text's tail can hold a new stop string: decode a window
            if ids[-1] == end:
                return True
            return bool(stop) and any(s in dec(ids[-64:], skip_special_tokens=False) for s in stop)

        def finish(ids: list[int]) -> str:
            ids = ids[:-1] if ids and ids[-1] == end else ids
            text = dec(ids, skip_special_tokens=False)
            cut = min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))
            return text[:cut]

        stream = None if on_text is None else TextStream(dec, stop, finish, on_text)
        return finish(generate_ids(self.model, prefix, causal, sampling, stopped, on_token=stream))


class TextStream:
    """Generated ids → text pieces as they come (``Generator``'s ``on_text``), one per token. Text is held back
    while it ends in an incomplete character (byte-level BPE) or could be the start of a stop string, so no piece
    shows what the final text cuts, and the pieces join to it. Only the tokens since the text last ended on a
    whole character (at least ``DECODE_WINDOW`` back) are decoded afresh at each token."""

    def __init__(self, decode, stop: Sequence[str], finish: Callable[[list[int]], str], emit: Callable[[str], None]):
        self.decode, self.stop, self.finish, self.emit = decode, stop, finish, emit
        self.base, self.settled = 0, ""  # ids[:base] decode to ``settled``
        self.shown: list[str] = []  # the pieces emitted so far
        self.n_shown = 0

    def __call__(self, ids: list[int], last: bool) -> None:
        if last:  # the final text, as the Generator returns it; what was shown is always its beginning
            text = self.finish(ids)
            self.emit(text[self.n_shown :] if text.startswith("".join(self.shown)) else "")
            return
        tail = self.decode(ids[self.base :], skip_special_tokens=False)
        clean = tail.rstrip("\ufffd")  # an incomplete UTF-8 character decodes as U+FFFD until it completes
        text = self.settled + clean
        if clean == tail and len(ids) - self.base >= DECODE_WINDOW:
            self.base, self.settled = len(ids), text
        ready = min(len(text) - self._held(text), self._first_stop(text))
        piece = text[self.n_shown : ready] if ready > self.n_shown else ""
        self.shown.append(piece)
        self.n_shown += len(piece)
        self.emit(piece)

    def _held(self, text: str) -> int:
        """Length of the longest tail of ``text`` that begins a stop string (it may yet be cut)."""
        return max(
            (n for s in self.stop for n in range(min(len(s), len(text)), 0, -1) if s.startswith(text[-n:])), default=0
        )

    def _first_stop(self, text: str) -> int:
        """Where the first stop string in the text not yet shown begins (its length when none does)."""
        found = (text.find(s, max(self.n_shown - len(s), 0)) for s in self.stop)
        return min((i for i in found if i >= 0), default=len(text))


def check_room(cfg, new_tokens: int, prompt_tokens: int = 0, option: str = "--max-tokens") -> None:
    """``check_new_tokens`` with the memory free now (asked only of a model whose decoding state grows)."""
    free = free_memory() if cache_bytes_per_token(cfg) else None
    check_new_tokens(cfg, new_tokens, prompt_tokens, free, option)


def free_memory() -> int | None:
    """Bytes free on the device generation runs on: the accelerator's, else the host's (None: unknown)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"] - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib * 1024
    except (OSError, StopIteration, ValueError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def load_generator(
    run_dir: str | Path, mode: str = "auto", step: int | None = None, max_new_tokens: int | None = None
) -> Generator:
    """The run's model (checkpoint ``step``, default the newest), ready to generate. ``max_new_tokens``, when
    given, is checked against what the model and memory allow before the model is loaded (a UserError)."""
    run = open_run(run_dir)
    if run.recipe.objective.kind != "lm":
        raise UserError(f"{run.dir}: is a {run.recipe.model.arch} run; generate needs a language model run")
    if max_new_tokens is not None:
        check_room(run.recipe.model, max_new_tokens)
    if mode not in ("auto", "prefix", "causal"):
        raise UserError(f"--mode {mode!r}: expected auto, prefix or causal")
    if mode == "auto":  # as the run was trained: finetuned prompts sit in the prefix; a clm run reads causally
        mode = "causal" if run.recipe.objective.mixture == "clm" and run.kind != "finetune" else "prefix"
    model, meta = run.load_model(step)
    return Generator(run, model, run.tokenizer(), mode, int(meta["step"]))
