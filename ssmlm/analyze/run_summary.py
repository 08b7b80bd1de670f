"""What a run is, read back for the report's summary: the model (family, size in parameters), the recipe, the
objective or task, the data, how long it trained (steps, tokens, wall time) and its headline numbers.

Everything comes from the run directory: recipe.yaml, run.json, summary.json, metrics.jsonl, RUN/eval/*.json,
the preprocessed data's metadata.json (when it is still on disk) and the model built as shapes (nothing is
allocated, no checkpoint is read). A piece that cannot be read is left out, never guessed.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssmlm.metrics_file import read_metrics


def family_name(arch: str) -> str:
    """The model family's name in reports, as its module declares it (the arch itself if it declares none)."""
    from ssmlm.models.config import facts as arch_facts

    return arch_facts(arch).name


# validation entries that count rather than measure (left out of the headline numbers)
COUNTS = ("target_tokens", "masked_tokens", "samples", "examples", "numbers", "books")


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl as dicts, one per (split, step): a step logged twice (a run started again before its first
    checkpoint, with an older ssmlm) keeps its last line; a line that is not JSON is skipped."""
    found: dict[tuple, dict] = {}
    for row in read_metrics(run_dir / "metrics.jsonl"):
        if "step" in row:
            found.pop((row.get("split"), row["step"]), None)  # keep the order of the last write
            found[(row.get("split"), row["step"])] = row
    return sorted(found.values(), key=lambda r: r["step"])


def train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "loss" in r and "split" not in r]


def validation_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r.get("split") == "validation"]


def read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def human(n: float) -> str:
    """1234567 -> "1.23M"."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.3g}" if isinstance(n, float) else str(n)


def param_counts(run) -> dict | None:
    """{"total", "non_embedding"} of the run's model, built as shapes; None when it cannot be built."""
    try:
        from ssmlm.models.flops import param_counts as counts

        return counts(run.abstract_model())
    except Exception:  # an older or damaged run: the summary goes on without the size
        return None


def model_line(run, counts: dict | None) -> str:
    cfg = run.recipe.model
    family = family_name(cfg.arch)
    size = ""
    if counts:
        size = f"{human(counts['total'])} parameters ({human(counts['non_embedding'])} without embeddings), "
    return f"{family}: {size}{cfg.num_layers} layers × d {cfg.hidden_size}, length {cfg.max_seq_length}"


def objective_line(run) -> str:
    """What the run was trained to do: its pretraining objective, or its finetuning task and source."""
    r = run.recipe
    if run.kind == "finetune":
        task = run.info.get("task") or r.task.name or "local files"
        line = f"finetuned on {task}"
        source = run.info.get("source")
        if run.random_init:  # the source run, if any, gave only the architecture
            from ssmlm.runs import random_init_text

            return line + f", from {random_init_text(source)}"
        return line + (f", from run {Path(source).name}" if source else ", from random weights")
    if r.objective.kind == "lm":
        mixture = r.objective.mixture
        more = " with Birdie's controller moving it" if mixture == "birdie" else ""
        return f"language modelling, mixture {mixture}{more}"
    if r.objective.kind == "mlm":
        return f"masked language modelling ({r.objective.masked_lm_prob:.0%} of tokens)"
    return r.objective.kind


def data_line(run) -> str:
    """The corpus (as the preprocessing described it, with its size) and the tokenizer."""
    from ssmlm.data.lm_tasks import LM_TASKS

    r = run.recipe
    if run.kind == "finetune":
        task = run.info.get("task") or r.task.name
        declared = LM_TASKS.get(task)
        if declared is not None and declared.data_line is not None:  # a language model's task says it itself
            return declared.data_line(r.task)
        files = [f for f in (r.task.train_file, r.task.data_dir) if f]
        return f"task {task}" + (f" ({files[0]})" if files else "")
    meta = read_json(Path(run.info.get("data_dir") or "/nonexistent") / "metadata.json")
    corpus = meta.get("corpus") or str(r.data.source)
    train = (meta.get("splits") or {}).get("train") or {}
    size = f", {human(train['tokens'])} training tokens" if isinstance(train.get("tokens"), int) else ""
    vocab = meta.get("vocab_size") or r.data.vocab_size
    return f"{corpus}{size}; {r.data.tokenizer_type} tokenizer, vocabulary {vocab:,}"


def seq_len(run) -> int:
    r = run.recipe
    if run.kind == "finetune":
        return r.task.max_seq_length or r.model.max_seq_length
    return r.seq_len


def length_facts(run, rows: list[dict], summary: dict) -> dict:
    """Steps (done / planned), tokens (slots and the real share), wall time and launches."""
    r = run.recipe
    train = train_rows(rows)
    step = summary.get("final_step", train[-1]["step"] if train else 0)
    total = summary.get("total_steps", r.train.steps)
    out = {"steps": f"{step:,} of {total:,}" + (" (stopped early)" if summary.get("stopped_early") else "")}
    slots = step * r.train.batch_size * seq_len(run)
    fills = [x["fill"] for x in train if isinstance(x.get("fill"), int | float)]
    fill = summary.get("fill_rate") or (sum(fills) / len(fills) if fills else None)
    tokens = f"{human(slots)} ({step:,} steps × {r.train.batch_size} rows × {seq_len(run)})"
    if isinstance(fill, int | float):
        tokens += f", {fill:.0%} of them real (not padding)"
    train_tokens = read_json(Path(run.info.get("data_dir") or "/nonexistent") / "metadata.json").get("splits") or {}
    corpus = (train_tokens.get("train") or {}).get("tokens")
    if isinstance(corpus, int) and corpus and isinstance(fill, int | float):
        tokens += f": {slots * fill / corpus:.2g} passes over the training tokens"
    out["tokens"] = tokens
    seconds = summary.get("seconds_total", summary.get("seconds"))
    if isinstance(seconds, int | float):
        launches = summary.get("launches")
        from ssmlm.progress import clock_time

        out["wall time"] = clock_time(seconds) + (
            f" over {launches} launches" if isinstance(launches, int) and launches > 1 else ""
        )
    return out


def headline(run, rows: list[dict], summary: dict) -> list[tuple[str, object]]:
    """The numbers a reader looks for first: the final training loss, the final (and best) validation, and
    the main metrics of every evaluation file."""
    out: list[tuple[str, object]] = []
    train = train_rows(rows)
    if train:
        out.append((f"training loss at step {train[-1]['step']:,}", train[-1]["loss"]))
    val = validation_rows(rows)
    last = val[-1] if val else {}
    for k, v in last.items():
        if k not in ("step", "split", *COUNTS) and not k.startswith("config_loss_") and _number(v):
            out.append((f"validation {k} at step {last['step']:,}", v))
    best = summary.get("best_validation")
    chosen = (run.info.get("metrics") or [None])[0]  # a finetuned run's selection metric comes first
    if isinstance(best, dict) and _number(best.get(chosen)) and best[chosen] != last.get(chosen):
        out.append((f"best validation {chosen} (step {best['step']:,})", best[chosen]))
    for f in sorted((run.dir / "eval").glob("*.json")):
        data = read_json(f)
        metrics = data.get("metrics") if isinstance(data.get("metrics"), dict) else {}
        shown = [(k, v) for k, v in metrics.items() if _number(v) and k not in COUNTS][:3]
        where = " ".join(str(data[k]) for k in ("task", "split") if data.get(k)) or f.stem
        out += [(f"{where}: {k}", v) for k, v in shown]
    return out


def lead(run, counts: dict | None, length: dict) -> str:
    """One sentence: what was trained, how, on what and for how long."""
    cfg = run.recipe.model
    size = f"{human(counts['total'])}-parameter " if counts else ""
    what = f"A {size}{family_name(cfg.arch)}, {cfg.num_layers} layers × d {cfg.hidden_size}"
    if run.kind == "finetune":
        how = objective_line(run)
    else:
        how = f"{'pretrained' if run.kind == 'pretrain' else run.kind} by {objective_line(run)}"
        corpus = read_json(Path(run.info.get("data_dir") or "/nonexistent") / "metadata.json").get("corpus")
        how += f" on {corpus}" if corpus else ""
    steps = length["steps"].split(" of ")[0]
    tokens = length["tokens"].split(" (")[0]
    took = f" in {length['wall time']}" if "wall time" in length else ""
    return f"{what}, {how}, for {steps} steps ({tokens} token slots){took}."


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def facts(run) -> dict:
    """{"model", "recipe", "objective", "data", "steps", "tokens", "wall time", "params", "headline"} of a run."""
    rows = metric_rows(run.dir)
    summary = read_json(run.dir / "summary.json")
    counts = param_counts(run)
    r = run.recipe
    recipe = r.name + (f": {r.description}" if r.description else "")
    length = length_facts(run, rows, summary)
    return {
        "lead": lead(run, counts, length),
        "model": model_line(run, counts),
        "recipe": recipe,
        "objective" if run.kind != "finetune" else "task": objective_line(run),
        "data": data_line(run),
        **length,
        "params": counts,
        "headline": headline(run, rows, summary),
    }
