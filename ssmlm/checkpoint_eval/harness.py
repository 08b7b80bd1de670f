"""The EleutherAI lm-evaluation-harness (lm-eval 0.4) on an ssmlm language-model run, as Birdie's official
adapter scores one (docs/faithfulness.md#birdie-evaluations).

``SsmlmLM`` is the harness's model interface, registered as "ssmlm" and built from the harness's argument
string ``ckpt=RUN[,mode=auto|prefix|causal][,batch_size=8][,step=N]``:

- ``loglikelihood``: log p(continuation | context), the context laid out as the run's generator lays out a
  prompt (the bidirectional prefix for a Birdie run, after START for a causal one), the continuation after
  it as causal targets (ssmlm.runs.scoring). The harness wants log-likelihoods, higher is better.
- ``loglikelihood_rolling``: the whole text as next-token targets after START (led by the next-token
  paradigm token where the run used them), in the harness's standard rolling windows of the run's
  training length, each window restarting with START; the sum of the log-probabilities.
- ``generate_until``: greedy decoding with the run's generator (sampling when a task asks for it with
  do_sample and a temperature), stopping at any ``until`` string or after ``max_gen_toks`` tokens.

lm-eval is an optional extra (``pip install 'ssmlm[harness]'``); only this module imports it. lm-eval 0.4
finds models only through its registry, filled by importing the module that defines them (it has no plugin
entry points), so the plain ``lm_eval --model ssmlm`` command needs this module imported first; ``ssmlm
evaluate --task lm-eval:…``, ``run_harness`` and ``lm_eval_cli`` (lm-eval's command line) do that.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ssmlm.errors import UserError

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window, simple_parse_args_string
except ImportError:  # an optional extra
    raise UserError("the lm-eval-harness adapter needs lm-eval: pip install 'ssmlm[harness]'") from None

from ssmlm.models.decode import Sampling
from ssmlm.progress import progress_bar
from ssmlm.runs.generate import Generator, load_generator
from ssmlm.runs.scoring import continuation_logprobs, prompt_requests

DEFAULT_BATCH_SIZE = 8
DEFAULT_MAX_GEN_TOKS = 256


@register_model("ssmlm")
class SsmlmLM(LM):
    def __init__(
        self,
        ckpt: str | Path | None = None,
        mode: str = "auto",
        batch_size: int | str | None = DEFAULT_BATCH_SIZE,
        step: int | None = None,
        generator: Generator | None = None,
        **ignored,  # the harness also passes max_batch_size and device: one JAX process decides those
    ):
        super().__init__()
        if generator is None:
            if not ckpt:
                raise UserError("lm-eval model ssmlm: pass ckpt=RUN_DIR in --model_args")
            generator = load_generator(ckpt, mode, None if step in (None, "") else int(step))
        self.generator = generator
        # "auto" (the harness's own batch-size search) has nothing to search for here
        self.batch_size = DEFAULT_BATCH_SIZE if batch_size in (None, "", "auto") else int(batch_size)
        if self.batch_size < 1:
            raise UserError(f"lm-eval model ssmlm: batch_size={batch_size}: expected a positive integer")
        self.max_length = self.generator.model.cfg.max_seq_length

    # lm-eval's command line passes its own --batch_size (default 1) beside --model_args: model_args win
    # rather than clash ("got multiple values for keyword argument")
    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> SsmlmLM:
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None}
        return cls(**{**extra, **arg_dict})

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> SsmlmLM:
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ---- the harness's three requests ----

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [req.args for req in requests]
        scores = continuation_logprobs(
            self.generator.model,
            prompt_requests(self.generator, pairs),
            batch_size=self.batch_size,
            max_len=self.max_length,
            desc=None if disable_tqdm else "loglikelihood",
        )
        out = [(logprob, greedy) for logprob, _, greedy in scores]
        for pair, result in zip(pairs, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", pair, result)
        return out

    def rolling_windows(self, text: str) -> list[tuple[list[int], list[int], list[int]]]:
        """Scoring requests covering every token of ``text`` once: (paradigm lead, [START, window context…],
        window targets), each at most ``max_length`` tokens long."""
        lead, (start,) = dataclasses.replace(self.generator, mode="causal").layout("")  # START alone
        ids = self.generator.tokenizer.encode(text, add_special_tokens=False).ids
        width = self.max_length - len(lead) - 1  # room left beside the lead and a window's START
        if width < 1:
            raise UserError(f"{self.generator.run.dir}: max_seq_length {self.max_length} is too short to score text")
        out = []
        for i, window in enumerate(get_rolling_token_windows(ids, start, width, context_len=1)):
            context, targets = make_disjoint_window(window)
            causal = context if i == 0 else [start, *context]  # the first window's context is START itself
            out.append((lead, causal, targets))
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        texts = [req.args[0] for req in requests]
        windows = [self.rolling_windows(t) for t in texts]
        scores = continuation_logprobs(
            self.generator.model,
            [w for ws in windows for w in ws],
            batch_size=self.batch_size,
            max_len=self.max_length,
            desc=None if disable_tqdm else "loglikelihood_rolling",
        )
        out, at = [], 0
        for text, ws in zip(texts, windows, strict=True):
            out.append(sum(lp for lp, _, _ in scores[at : at + len(ws)]))
            at += len(ws)
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), out[-1])
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out = []
        with progress_bar(disable_tqdm) as bar:
            task = bar.add_task("generate_until", total=len(requests))
            for req in requests:
                context, kwargs = req.args
                kwargs = dict(kwargs or {})
                until = kwargs.get("until") or []
                until = [until] if isinstance(until, str) else list(until)
                temperature = float(kwargs.get("temperature", 0.0) or 0.0) if kwargs.get("do_sample") else 0.0
                sampling = Sampling(
                    max_new_tokens=int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), temperature=temperature
                )
                text = self.generator(context, sampling, stop=until)
                out.append(text)
                self.cache_hook.add_partial("generate_until", (context, kwargs), text)
                bar.advance(task)
        return out


def task_manager(tasks: list[str], include_path: str | Path | None, trust_task_code: bool = False):
    """lm-eval's task index: only ``include_path``'s tasks when every name is found there (indexing the
    thousands of built-in task files takes seconds), else the built-in tasks and ``include_path``'s. A folder whose
    YAMLs name Python is refused unless ``trust_task_code`` (ssmlm.data.task_code), before lm-eval reads it."""
    from lm_eval.tasks import TaskManager

    from ssmlm.data.task_code import check_task_folder

    if include_path is not None:
        if not Path(include_path).is_dir():
            raise UserError(f"--data-dir {include_path}: no such folder of lm-eval task YAML files")
        check_task_folder(include_path, trust_task_code)
        local = TaskManager(include_path=str(include_path), include_defaults=False)
        if all(t in local.all_tasks for t in tasks):
            return local
    manager = TaskManager(include_path=None if include_path is None else str(include_path))
    missing = [t for t in tasks if t not in manager.all_tasks]
    if missing:
        where = "lm-eval's tasks" + ("" if include_path is None else f" or {include_path}")
        raise UserError(f"lm-eval task {missing[0]!r}: not found among {where} (see `lm_eval ls tasks`)")
    return manager


def run_harness(
    ckpt: str | Path,
    tasks: list[str],
    limit: int | float | None = None,
    num_fewshot: int = 0,
    include_path: str | Path | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    mode: str = "auto",
    step: int | None = None,
    bootstrap_iters: int = 100_000,
    trust_task_code: bool = False,
) -> dict:
    """lm-eval's ``simple_evaluate`` of the run at ``ckpt`` on ``tasks`` (names of built-in tasks, or of
    task YAML files under ``include_path``; a folder whose YAMLs name Python only with ``trust_task_code``).
    Returns its result dict: ``results`` maps each task to its metrics (e.g. {"acc,none": 0.5,
    "acc_stderr,none": …}), beside ``configs``, ``versions``, ``n-shot``…"""
    import lm_eval

    if not tasks:
        raise UserError("lm-eval: name at least one task (--task lm-eval:TASK1,TASK2)")
    manager = task_manager(tasks, include_path, trust_task_code)
    lm = SsmlmLM(ckpt, mode=mode, batch_size=batch_size, step=step)
    try:
        return lm_eval.simple_evaluate(
            model=lm,
            tasks=list(tasks),
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=manager,
            log_samples=False,
            bootstrap_iters=bootstrap_iters,
        )
    except ConnectionError as e:  # datasets' "Couldn't reach … on the Hub" (offline mode included)
        raise UserError(
            f"lm-eval:{','.join(tasks)}: the task data could not be loaded ({e}); without network, pass "
            "--data-dir DIR with task YAMLs whose dataset_path / data_files point at local files"
        ) from None


def local_task_paths(argv: list[str]) -> list[tuple[str, str]]:
    """(option, path) of each local task source on lm-eval's command line: --include_path's folder, and each
    --tasks entry that is a YAML file or folder on disk (lm-eval loads those too)."""
    out = []
    for i, arg in enumerate(argv):
        opt, eq, value = arg.partition("=")
        if opt not in ("--include_path", "--tasks", "-t"):
            continue
        value = value if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        if opt == "--include_path":
            out.append((opt, value))
        else:
            out += [(opt, t) for t in value.split(",") if t and Path(t).expanduser().exists()]
    return out


def lm_eval_cli() -> None:
    """lm-eval's own command line (``lm_eval run --model ssmlm --model_args ckpt=RUN --tasks …``) with the
    "ssmlm" model registered: lm-eval 0.4 has no plugin entry points, so its plain ``lm_eval`` cannot find it.
    As with ``ssmlm evaluate``, local task YAMLs that name Python are refused unless ``--trust-task-code``
    (ours, taken off the line before lm-eval parses it)."""
    import sys

    from lm_eval.__main__ import cli_evaluate

    from ssmlm.data.task_code import check_task_folder

    trusted = "--trust-task-code" in sys.argv[1:]
    sys.argv = [sys.argv[0], *(a for a in sys.argv[1:] if a != "--trust-task-code")]
    try:
        for opt, path in local_task_paths(sys.argv[1:]):
            check_task_folder(path, trusted, opt)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    cli_evaluate()
