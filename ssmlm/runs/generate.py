"""Text generation from a language-model run: the Python function the evaluations use, and what
`ssmlm generate` prints.

Where the prompt goes (``mode``): ``prefix`` puts it in the bidirectional prefix, then START, as Birdie
trains its prefix objectives (birdie_official.md §3.1, §5.1); ``causal`` puts START first and the prompt after
it, as a next-token-only (clm) run was trained; ``auto`` picks causal for clm pretraining runs and prefix
otherwise (a finetuned run was trained with its prompts in the prefix, whatever its pretraining mixture).
The prompt is led by the paradigm token of the objective class it imitates (prefix LM or next token), as the
run's samples were (unless the run used ``objective.paradigm: none``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ssmlm.data.reserved import END, PARADIGMS, START
from ssmlm.errors import UserError
from ssmlm.models.decode import Sampling, generate_ids
from ssmlm.runs import Run, open_run


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

    def __call__(self, prompt: str, sampling: Sampling = Sampling(), stop: Sequence[str] = ()) -> str:
        prefix, causal = self.layout(prompt)
        dec = self.tokenizer.decode

        end = self.tokenizer.token_to_id(END)

        def stopped(ids: list[int]) -> bool:
            # END closes a finetuned response; only the text's tail can hold a new stop string: decode a window
            if ids[-1] == end:
                return True
            return bool(stop) and any(s in dec(ids[-64:], skip_special_tokens=False) for s in stop)

        ids = generate_ids(self.model, prefix, causal, sampling, stopped)
        ids = ids[:-1] if ids and ids[-1] == end else ids
        text = dec(ids, skip_special_tokens=False)
        cut = min((i for s in stop if (i := text.find(s)) >= 0), default=len(text))
        return text[:cut]


def load_generator(run_dir: str | Path, mode: str = "auto", step: int | None = None) -> Generator:
    run = open_run(run_dir)
    if run.recipe.objective.kind != "lm":
        raise UserError(f"{run.dir}: is a {run.recipe.model.arch} run; generate needs a language model run")
    if mode not in ("auto", "prefix", "causal"):
        raise UserError(f"--mode {mode!r}: expected auto, prefix or causal")
    if mode == "auto":  # as the run was trained: finetuned prompts sit in the prefix; a clm run reads causally
        mode = "causal" if run.recipe.objective.mixture == "clm" and run.kind != "finetune" else "prefix"
    model, meta = run.load_model(step)
    return Generator(run, model, run.tokenizer(), mode, int(meta["step"]))
