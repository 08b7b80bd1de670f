"""What a command prints when it is done: a dry run's plan (`--dry-run`), a training run's summary, an
evaluation's metrics (written to its JSON first), `finetune --seeds`' spread over seeds (written too) and an
analysis' result."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ssmlm import paths, staging


def print_plan(p: dict) -> None:
    """A dry run's plan (ssmlm.train.plan): the model's size, its FLOPs and the memory it needs."""
    from rich.console import Console

    from ssmlm.display.terminal import titled

    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    t = titled(f"dry run: {p['recipe']} ({p['kind']})", show_header=False)
    t.add_row("architecture", f"{p['arch']}: {p['layers']} layers, d={p['hidden_size']}, {p['width']}")
    t.add_row("sequence length / vocab", f"{p['seq_len']} / {p['vocab_size']:,}")
    t.add_row("parameters", f"{p['params_total']:,} ({p['params_total'] / 1e6:.1f}M)")
    t.add_row(
        "parameters without embeddings", f"{p['params_non_embedding']:,} ({p['params_non_embedding'] / 1e6:.1f}M)"
    )
    t.add_row("training FLOPs / token", f"{p['train_flops_per_token']:.3e}")
    t.add_row("tokens / step", f"{p['tokens_per_step']:,}")
    epochs = f"{p['epochs']:g} epochs" if p.get("epochs") else ""
    if p["steps"] is None:  # finetuning by epochs of a task whose size only reading it tells
        t.add_row("training FLOPs (all steps)", f"{epochs} (steps depend on the data)")
    else:
        rows = f" ({epochs} of {p['train_rows']:,} rows)" if p.get("train_rows") else ""
        t.add_row("training FLOPs (all steps)", f"{p['train_flops_total']:.3e} over {p['steps']:,} steps{rows}")
    m = p["memory_bytes"]
    t.add_row("memory: params / AdamW / grads", f"{gib(m['params'])} / {gib(m['optimizer'])} / {gib(m['gradients'])}")
    t.add_row("memory: total (before activations)", gib(m["total"]))
    Console().print(t)


def print_summary(summary: dict, run_dir: Path, start: str | None = None) -> None:
    """A finished training run's summary.json: its steps, final training and validation metrics, its time;
    ``start``: where its weights came from, when the title should say (a random initialisation)."""
    from rich.console import Console

    from ssmlm.display.terminal import metric_text, titled

    t = titled(f"{summary.get('kind', '')} → {run_dir}" + (f", from {start}" if start else ""), show_header=False)
    t.add_row("steps", f"{summary.get('start_step', 0)} → {summary.get('final_step')}")
    for k, v in (summary.get("train") or {}).items():
        t.add_row(f"train {k}", metric_text(k, v))
    val = summary.get("validation") or {}
    per_config = [v for k, v in val.items() if k.startswith("config_loss_")]
    for k, v in val.items():
        if not k.startswith("config_loss_"):  # Birdie's per-configuration losses: summarised below
            t.add_row(f"validation {k}", metric_text(k, v))
    if per_config:
        t.add_row(
            f"validation loss per configuration ({len(per_config)})", f"{min(per_config):.3f} – {max(per_config):.3f}"
        )
    if summary.get("seconds") is not None:
        t.add_row("seconds", str(summary["seconds"]))
    if summary.get("launches", 1) > 1:  # a run stopped and started again: its whole time
        t.add_row(f"seconds over {summary['launches']} starts", str(summary["seconds_total"]))
    Console().print(t)


def print_best_validation(summary: dict) -> None:
    """An encoder's best validation metrics seen during training, under its summary (the final ones are in it)."""
    best = summary.get("best_validation")
    if not best:
        return
    from ssmlm.display.terminal import metric_text

    values = ", ".join(f"{k} {metric_text(k, v)}" for k, v in best.items() if k not in ("step", "split"))
    typer.echo(
        f"final validation is in the table; best seen during training (step {best['step']}): "
        f"{values} (optimistic: the official BiGS script reports this one)"
    )


def result_name(task: str, split: str, entries: tuple[int, int] | None = None) -> str:
    """An evaluation's file name in RUN/eval: TASK-SPLIT.json; phone books of a size asked for (``entries``,
    `evaluate --entries`) TASK-eN-SPLIT.json or TASK-eLO-HI-SPLIT.json, beside the run's own books' result."""
    if entries is None:
        return f"{task}-{split}.json"
    lo, hi = entries
    return f"{task}-e{lo if lo == hi else f'{lo}-{hi}'}-{split}.json"


def write_result(
    result: dict, path: Path | None, run, entries: tuple[int, int] | None = None, shown: str | None = None
) -> None:
    """Write an evaluation's JSON (RUN/eval/TASK-SPLIT.json by default: see result_name) and print its numeric
    metrics. ``shown``: how to name ``path`` to the user (a gs:// URL it is uploaded to)."""
    from rich.console import Console

    path = path or run.dir / "eval" / result_name(result["task"], result["split"], entries)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2))
    from ssmlm.display.terminal import metric_text, titled

    where = staging.location(run.dir)  # a run in a bucket: its URL, not the staging folder's
    t = titled(f"{result['task']} / {result['split']} — {where} (step {result['step']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    for k, v in result["metrics"].items():
        if isinstance(v, int | float):
            t.add_row(k, metric_text(k, v))
    Console().print(t)
    also = [result[k] for k in ("submission", "predictions") if result.get(k)]
    if shown is None:
        shown = where + str(path)[len(str(run.dir)) :] if str(path).startswith(str(run.dir)) else str(path)
    typer.echo(f"wrote {shown}" + "".join(f" and {p}" for p in also))


def write_seeds(over_seeds: dict, path: Path | str) -> None:
    """Write ssmlm.experiment.stats.over_seeds' result (RUN-seeds.json; a gs:// URL: the object) and print each
    final metric's spread."""
    text = json.dumps(over_seeds, indent=2)
    if paths.is_remote(path):
        paths.write_bytes(str(path), text.encode())
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for k, v in over_seeds["final"].items():
        typer.echo(f"{k}: {v['mean']:.4f} ± {v['std']:.4f} over {len(over_seeds['seeds'])} seeds (final)")
    typer.echo(f"wrote {path}")


def print_result(result: dict, title: str, as_json: bool) -> None:
    """A command's returned result (an analysis'): tables under ``title`` that fit 80 columns, or JSON."""
    if as_json:
        typer.echo(json.dumps(result, indent=2))
        return
    from rich.console import Console

    from ssmlm.display.terminal import result_tables

    console = Console()
    for table in result_tables(result, title, console):
        console.print(table)


def target_rows(r: dict) -> list[tuple[str, str]]:
    """A `--dry-run --target` report (ssmlm.train.aot) as (label, text) rows."""
    gib = lambda b: f"{b / 2**30:.2f} GiB"  # noqa: E731
    m, mesh = r["memory"], r["mesh"]
    per = "chip" if r["devices"] == r["chips"] else "device (TensorCore)"
    cores = "" if r["devices"] == r["chips"] else f", {r['devices']} jax devices (one per TensorCore)"
    rows = [
        ("target", f"{r['target']}: {r['chips']} × {r['accelerator']} on {r['hosts']} host(s){cores}"),
        ("mesh", f"data {mesh['data']} × fsdp {mesh['fsdp']} × tensor {mesh['tensor']}"),
        (
            "batch",
            f"{r['batch_size']} × {r['seq_len']}, grad_accum {r['grad_accum']}: {r['micro_batch_per_device']:g} rows "
            f"per {per} per micro-batch; remat {'on' if r['remat'] else 'off'}",
        ),
        ("parameters", f"{r['params']:,} ({r['params'] / 1e6:.1f}M)"),
    ]
    if "arguments" in m:
        rows.append(
            (
                f"memory per {per}",
                f"arguments {gib(m['arguments'])} (parameters, optimizer state, batch), temporaries "
                f"{gib(m['temporaries'])}, outputs not updated in place {gib(m['outputs'] - m['aliased'])}, "
                f"code {gib(m['generated_code'])}",
            )
        )
    if m["fits"]:
        verdict = f"fits: {gib(m['total'])} of {gib(m['hbm'])}, {gib(m['hbm'] - m['total'])} free"
    elif "oom_message" in m:  # the TPU compiler refused it: its message names what the temporaries alone need
        need = "more than the chip has" if m["total"] is None else f"{gib(m['total'])} for temporaries alone"
        verdict = f"does not fit: XLA refused the program, it needs {need} ({gib(m['hbm'])} per {per})"
    else:
        verdict = f"does not fit: needs {gib(m['total'])} of {gib(m['hbm'])}"
    rows.append(("fit", verdict))
    rows.append(("compile", f"{r['compile_seconds']:.1f} s on this machine"))
    rows.append(("FLOPs / step", f"{r['model_flops_per_step']:.3e} (ssmlm's analytic count, ssmlm.models.flops)"))
    if r["collectives"]:
        parts = [
            f"{k} {c['ops']} ops, {c['runs']:,} per step, {gib(c['bytes'])}"
            for k, c in r["collectives"].items()
            if c["ops"]
        ]
        text = "; ".join(parts) or "none"
        if unknown := r.get("loops_of_unknown_count"):  # their collectives were counted once per step
            text += (
                f"; at least: {len(unknown)} loop(s) whose trip count could not be read from the program counted "
                f"once ({', '.join(unknown[:3])}{', …' if len(unknown) > 3 else ''})"
            )
        rows.append((f"collectives per {per}", text))
    est = r["roofline"]
    rows.append(
        (
            "roofline (estimate)",
            f"step ≥ {est['step_seconds_at_least'] * 1e3:,.1f} ms ({est['bound_by']}-bound): ≤ "
            f"{est['tokens_per_second_at_most']:,.0f} tokens/s, MFU ≤ {est['mfu_at_most']:.0%} "
            "(datasheet peaks, unmeasured)" + (f"; {est['note']}" if est.get("note") else ""),
        )
    )
    if r.get("paths"):
        rows.append(("compiled paths", ", ".join(f"{k} {v}" for k, v in r["paths"].items())))
    return rows


def print_target_report(r: dict) -> None:
    from rich.console import Console

    from ssmlm.display.terminal import titled

    t = titled(f"dry run on {r['target']}: {r['recipe']}", show_header=False)
    for label, text in target_rows(r):
        t.add_row(label, text)
    Console().print(t)


def print_fit(found: dict) -> None:
    """`--dry-run --target --fit`: the settings tried, then the target report of the one chosen (ssmlm.train.fit)."""
    from rich.console import Console

    from ssmlm.display.terminal import titled
    from ssmlm.train.fit import MAX_COMPILES

    t = titled(f"--fit on {found['target']}: {found['recipe']}", show_header=True)
    t.add_column("setting")
    t.add_column("fits")
    t.add_column("memory / chip", justify="right")
    for row in found["tried"]:
        mem = "-" if row["memory"] is None else f"{row['memory'] / 2**30:.2f} GiB"
        t.add_row(row["setting"], "yes" if row["fits"] else "no", mem)
    Console().print(t)
    if found["compile_budget_spent"]:
        Console().print(f"(the search stopped after {MAX_COMPILES} compiles)")
    if found["chosen"] is None:
        Console().print(f"nothing fits: {found['why']}", soft_wrap=True)
        return
    print_target_report(found["report"])
    Console().print("fits with: " + " ".join(f"--set {o}" for o in found["overrides"]), soft_wrap=True)
