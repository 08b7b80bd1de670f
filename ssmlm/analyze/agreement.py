"""`analyze agreement`: targeted syntactic evaluation of an MLM (BiGS Table 5 and Figure 8).

Goldberg (2019)'s protocol: the word whose form carries the agreement (a verb, or a reflexive) is replaced by
[MASK]; the item is right when the MLM scores the grammatical form above the ungrammatical one at that slot
(logits compared; the softmax normaliser is the same for both). An item whose two forms are not each one token
of the run's vocabulary is skipped and counted, as Goldberg skipped words missing from BERT's vocabulary.

Stimuli files are read in the layout of Goldberg's released files (tab-separated, no header), recognised by
their column count; ``--data`` may be given once per file:

  Marvin & Linzen (2018), his ``marvin_linzen_dataset.tsv`` (4 columns; the sentences are the last two):
      condition  type  grammatical sentence  ungrammatical sentence
  The two sentences differ in exactly one word, the masked one (other items are skipped, as Goldberg did);
  a final "." is appended. Conditions are LM_syneval's template names (simple_agrmt, sent_comp, vp_coord, ...);
  "inanim" variants count with "anim" ones, as in Goldberg's tables.

  Linzen et al. (2016) attractors, his ``lgd_dataset.tsv`` (5 columns):
      number of attractors  original sentence  sentence with ***mask***  grammatical form  ungrammatical form

The stimuli are not on the Hugging Face hub in this layout, so there is no download: pass the files, or
``--sample`` for the small hand-written sets shipped in ssmlm/analyze/data/ (a demo, not the paper's data).

Inputs are padded with [PAD] to the run's max_seq_length, as `finetune` and `evaluate` encode task inputs
by default (the official BiGS setting); a sentence longer than that is skipped and counted.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from ssmlm import checks
from ssmlm.analyze.plots import save_figure, write_csv
from ssmlm.errors import DataError, UserError
from ssmlm.markdown import markdown_table

NAME = "agreement"
FIGURE = "BiGS Table 5 and Figure 8"
DATA = Path(__file__).parent / "data"
SAMPLES = (DATA / "marvin_linzen_sample.tsv", DATA / "lgd_sample.tsv")
MASK = "***mask***"

# BiGS Table 5: (phenomenon, LM_syneval condition, row label, BiGS, BERT, LSTM (Goldberg's copy of M&L's numbers))
TABLE5 = (
    ("subject-verb", "simple_agrmt", "Simple", 100.0, 100.0, 94.0),
    ("subject-verb", "sent_comp", "Sentential complement", 85.1, 85.6, 99.0),
    ("subject-verb", "vp_coord", "Short VP coordination", 91.0, 86.5, 90.0),
    ("subject-verb", "long_vp_coord", "Long VP coordination", 97.5, 97.5, 61.0),
    ("subject-verb", "prep_anim", "Across prep phrase", 88.6, 84.8, 57.0),
    ("subject-verb", "subj_rel", "Across subj relative clause", 88.4, 84.9, 56.0),
    ("subject-verb", "obj_rel_across_anim", "Across obj relative clause", 89.9, 85.1, 50.0),
    ("subject-verb", "obj_rel_no_comp_across_anim", "Across obj relative (-that)", 86.9, 81.1, 52.0),
    ("subject-verb", "obj_rel_within_anim", "In obj relative clause", 97.2, 99.1, 84.0),
    ("subject-verb", "obj_rel_no_comp_within_anim", "In obj relative (-that)", 88.7, 81.6, 71.0),
    ("reflexive anaphora", "simple_reflexives", "Simple", 97.1, 98.9, 83.0),
    ("reflexive anaphora", "reflexive_sent_comp", "In a sentential complement", 79.9, 86.2, 86.0),
    ("reflexive anaphora", "reflexives_across", "Across a relative clause", 79.1, 75.9, 55.0),
)
TABLE_COLUMNS = (
    "phenomenon",
    "condition",
    "label",
    "items",
    "skipped",
    "correct",
    "accuracy",
    "paper_bigs",
    "paper_bert",
    "paper_lstm",
)
ATTRACTOR_COLUMNS = ("attractors", "items", "skipped", "correct", "accuracy")
MIN_ITEMS = 10  # scored items an accuracy needs to be read: fewer are greyed and marked in the figures


@dataclasses.dataclass(frozen=True)
class Item:
    """One minimal pair: the sentence around the masked slot, and the two forms that could fill it."""

    kind: str  # "marvin" (a Table 5 condition) or "attractors" (Figure 8)
    condition: str  # LM_syneval condition, or the number of attractors
    pre: str
    post: str
    good: str
    bad: str


def command(
    ckpt: Annotated[str, typer.Option("--ckpt", help="Run directory of an MLM pretraining run (or imported MLM).")],
    data: Annotated[
        list[str] | None,
        typer.Option("--data", help="Stimuli file in Goldberg's layout (Marvin & Linzen or attractors); repeatable."),
    ] = None,
    sample: Annotated[
        bool, typer.Option("--sample", help="Use the small hand-written stimuli shipped with ssmlm (a demo).")
    ] = False,
    batch_size: Annotated[int, typer.Option("--batch-size")] = 64,
    out: Annotated[str | None, typer.Option("--out", help="Output directory (default: RUN/analysis).")] = None,
):
    """Subject-verb and reflexive agreement accuracy of an MLM (BiGS Table 5 and Figure 8).

    Goldberg (2019)'s protocol on Marvin & Linzen (2018)'s stimuli (Table 5, per condition, the paper's BiGS
    and BERT numbers beside ours) and Linzen et al. (2016)'s attractor sentences (Figure 8, accuracy by number
    of attractors). Stimuli files use Goldberg's layout (see `ssmlm.analyze.agreement`).
    Example: ssmlm analyze agreement --ckpt runs/default --data marvin_linzen_dataset.tsv --data lgd_dataset.tsv
    """
    checks.option("--batch-size", batch_size, checks.POSITIVE)
    checks.run_dir(ckpt, "--ckpt")
    paths = [Path(p).expanduser() for p in data or []] + (list(SAMPLES) if sample else [])
    if not paths:
        raise UserError(
            "no stimuli: pass --data FILE (Goldberg's marvin_linzen_dataset.tsv / lgd_dataset.tsv layout), "
            "or --sample for the small shipped set"
        )
    from ssmlm.runs import open_run

    run = open_run(ckpt)
    check_applies(run)
    result = analyze_agreement(run, paths, Path(out) if out else run.dir / "analysis", batch_size)
    return result  # printed by the CLI: tables, or JSON with --json


def applies(run) -> bool:
    """An encoder with an MLM head: a pretraining (or extended, or imported) run of an MLM objective."""
    from ssmlm.models import is_lm

    return run.kind != "finetune" and not is_lm(run.recipe.model.arch) and run.recipe.objective.kind == "mlm"


def check_applies(run) -> None:
    if not applies(run):
        raise UserError(
            f"{run.dir}: a {run.kind} run of {run.recipe.model.arch} ({run.recipe.objective.kind}); agreement needs "
            "an MLM pretraining run"
        )


def for_report(run, out_dir: Path) -> dict | None:
    """The shipped sample stimuli on an MLM pretraining run (the report has no stimuli files of its own)."""
    if not applies(run):
        return None
    result = analyze_agreement(run, list(SAMPLES), out_dir)
    head = result["headline"]
    if head["skipped"] == head["items"]:  # nothing scored: empty bars would say nothing, the reason does
        import csv
        from collections import Counter

        with open(result["items"], newline="") as f:
            why = Counter(row["skipped"] for row in csv.DictReader(f))
        reasons = ", ".join(f"{n} {k}" for k, n in why.most_common())
        return {
            "title": "Agreement (Goldberg's protocol, sample stimuli)",
            "figure": FIGURE,
            "images": [],
            "data": [result["items"]],
            "numbers": {"items": head["items"], "skipped": head["skipped"]},
            "note": f"None of the {head['items']} sample items could be scored on this run ({reasons}: the "
            "two verb forms must each be one token of the run's vocabulary, and the sentence must fit "
            f"{run.recipe.model.max_seq_length} tokens).",
        }
    numbers = {"stimuli": "hand-written sample (ssmlm/analyze/data)", "items": head["items"]}
    numbers["skipped"] = head["skipped"]
    for k, v in head.items():
        n = result["scored"].get(k)
        if n is not None:
            numbers[k] = "n/a" if v is None else f"{v:.1f}% (n = {n}{', too few to read' if n < MIN_ITEMS else ''})"
    few = max(result["scored"].values(), default=0) < MIN_ITEMS
    return {
        "title": "Agreement (Goldberg's protocol, sample stimuli)",
        "figure": FIGURE,
        "images": [result["plot_table5"], result["plot_attractors"]],
        "data": [result["table5"], result["table5_markdown"], result["attractors"], result["items"]],
        "numbers": numbers,
        "note": f"Rows and points with fewer than {MIN_ITEMS} scored items are greyed: too few to read; conditions "
        "with none are left out of the figure.",
        **(
            {
                "too_few": f"no condition has {MIN_ITEMS} scored items (the shipped sample has at most 4 per "
                "condition): pass the full stimuli to `ssmlm analyze agreement --data`"
            }
            if few
            else {}
        ),
    }


# ----------------------------------------------------------------------------- stimuli


def canonical(condition: str) -> str:
    """Goldberg's tables count a condition's inanimate items with its animate ones."""
    return condition.replace("inanim", "anim")


def read_stimuli(path: Path) -> list[Item]:
    """Items of one file in either of Goldberg's layouts (see the module doc); Marvin & Linzen pairs that
    differ in other than one word are dropped here, as Goldberg's loader dropped them."""
    if not path.is_file():
        raise UserError(f"--data '{path}': no such file")
    items = []
    with path.open(encoding="utf8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            cols = line.rstrip("\n").split("\t")
            if len(cols) == 5 and cols[2].count(MASK) == 1 and cols[0].strip().isdigit():
                pre, post = cols[2].split(MASK)
                items.append(Item("attractors", str(int(cols[0])), pre.strip(), post.strip(), cols[3], cols[4]))
            elif len(cols) >= 4:
                good, bad = cols[-2].split(), cols[-1].split()
                if len(good) != len(bad):
                    continue
                diff = [i for i, (g, b) in enumerate(zip(good, bad, strict=True)) if g != b]
                if len(diff) != 1:
                    continue
                i = diff[0]
                items.append(
                    Item(
                        "marvin",
                        canonical(cols[0]),
                        " ".join(good[:i]),
                        " ".join(good[i + 1 :] + ["."]),
                        good[i],
                        bad[i],
                    )
                )
            else:
                raise DataError(
                    f"{path}:{n}: expected 4 tab-separated columns (condition, type, good sentence, bad sentence) "
                    f"or 5 (attractors, sentence, sentence with {MASK}, good form, bad form); got {len(cols)}"
                )
    if not items:
        raise DataError(f"{path}: no stimuli in it")
    return items


# ----------------------------------------------------------------------------- scoring


def encode_items(items: list[Item], tokenizer, max_len: int) -> list[dict]:
    """Per item: input ids ([CLS] pre [MASK] post [SEP]), the mask position and the two forms' ids, or why
    it is skipped ("not one token" / "too long")."""
    special = {s: tokenizer.token_to_id(s) for s in ("[CLS]", "[SEP]", "[MASK]", "[UNK]")}
    if special["[MASK]"] is None or special["[CLS]"] is None:
        raise UserError("the run's tokenizer has no [MASK]/[CLS] token: agreement needs an MLM tokenizer")

    def ids(texts: list[str]) -> list[list[int]]:  # one batched call: the full stimuli sets are large
        return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)] if texts else []

    words = sorted({w for item in items for w in (item.good, item.bad)})
    single = {
        w: e[0] if len(e) == 1 and e[0] != special["[UNK]"] else None for w, e in zip(words, ids(words), strict=True)
    }
    pres, posts = ids([item.pre for item in items]), ids([item.post for item in items])
    out = []
    for item, pre, post in zip(items, pres, posts, strict=True):
        good, bad = single[item.good], single[item.bad]
        tokens = [special["[CLS]"], *pre, special["[MASK]"], *post, special["[SEP]"]]
        skip = "not one token" if good is None or bad is None else "too long" if len(tokens) > max_len else None
        out.append({"ids": tokens, "position": len(pre) + 1, "good": good, "bad": bad, "skip": skip})
    return out


def score_items(model, encoded: list[dict], max_len: int, batch_size: int = 64) -> list[tuple[float, float] | None]:
    """(score of the good form, score of the bad form) per item, None for skipped ones.

    Every sentence is right-padded with [PAD] (id 0) to the run's max_seq_length, as `finetune` and `evaluate`
    encode task inputs by default (the official BiGS setting: its kernels have one fixed length); one compiled
    shape serves every batch. The MLM logits are read at the masked slot only.
    """
    from flax import nnx

    from ssmlm.progress import progress_bar

    forward = nnx.jit(lambda m, ids, pos: m(ids, positions=pos)[:, 0])
    scores: list[tuple[float, float] | None] = [None] * len(encoded)
    todo = [i for i, e in enumerate(encoded) if e["skip"] is None]
    size = max(1, min(batch_size, len(todo)))
    with progress_bar() as bar:
        task = bar.add_task("scoring agreement items", total=len(todo))
        for start in range(0, len(todo), size):
            _score_batch(forward, model, encoded, todo[start : start + size], size, max_len, scores)
            bar.advance(task, min(size, len(todo) - start))
    return scores


def _score_batch(forward, model, encoded, chunk, size, max_len, scores) -> None:
    """Score the items ``chunk`` (indices into ``encoded``) in one (size, max_len) batch, into ``scores``."""
    import jax.numpy as jnp
    import numpy as np

    ids = np.zeros((size, max_len), np.int32)
    pos = np.zeros((size, 1), np.int32)
    for r, i in enumerate(chunk):  # rows past the chunk stay all-[PAD]; their logits are not read
        ids[r, : len(encoded[i]["ids"])] = encoded[i]["ids"]
        pos[r, 0] = encoded[i]["position"]
    logits = np.asarray(forward(model, jnp.asarray(ids), jnp.asarray(pos)))
    for r, i in enumerate(chunk):
        scores[i] = (float(logits[r, encoded[i]["good"]]), float(logits[r, encoded[i]["bad"]]))


def tally(items: list[Item], scores: list) -> dict[tuple[str, str], dict]:
    """(kind, condition) -> items, skipped, correct, accuracy (%, over the scored items; None if none)."""
    out: dict[tuple[str, str], dict] = {}
    for item, s in zip(items, scores, strict=True):
        t = out.setdefault((item.kind, item.condition), {"items": 0, "skipped": 0, "correct": 0})
        t["items"] += 1
        if s is None:
            t["skipped"] += 1
        else:
            t["correct"] += int(s[0] > s[1])
    for t in out.values():
        scored = t["items"] - t["skipped"]
        t["accuracy"] = round(100.0 * t["correct"] / scored, 2) if scored else None
    return out


def table5_rows(counts: dict) -> list[dict]:
    """Table 5's rows in the paper's order (with its numbers), then any other condition of the data."""
    rows = []
    known = {cond for _, cond, *_ in TABLE5}
    empty = {"items": 0, "skipped": 0, "correct": 0, "accuracy": None}
    for group, cond, label, bigs, bert, lstm in TABLE5:
        t = counts.get(("marvin", cond), empty)
        rows.append(
            {
                "phenomenon": group,
                "condition": cond,
                "label": label,
                **t,
                "paper_bigs": bigs,
                "paper_bert": bert,
                "paper_lstm": lstm,
            }
        )
    for (kind, cond), t in sorted(counts.items()):
        if kind == "marvin" and cond not in known:
            rows.append(
                {
                    "phenomenon": "other",
                    "condition": cond,
                    "label": cond,
                    **t,
                    "paper_bigs": None,
                    "paper_bert": None,
                    "paper_lstm": None,
                }
            )
    return rows


def attractor_rows(counts: dict) -> list[dict]:
    found = sorted((int(c), t) for (kind, c), t in counts.items() if kind == "attractors")
    return [{"attractors": n, **t} for n, t in found]


def analyze_agreement(run, paths: list[Path], out_dir: Path, batch_size: int = 64) -> dict:
    items = [item for p in paths for item in read_stimuli(p)]
    model, meta = run.load_model()
    encoded = encode_items(items, run.tokenizer(), run.recipe.model.max_seq_length)
    scores = score_items(model, encoded, run.recipe.model.max_seq_length, batch_size)
    counts = tally(items, scores)
    table, attractors = table5_rows(counts), attractor_rows(counts)

    out_dir.mkdir(parents=True, exist_ok=True)
    paths_out = {
        "table5": write_csv(out_dir / "agreement_table5.csv", TABLE_COLUMNS, table),
        "attractors": write_csv(out_dir / "agreement_attractors.csv", ATTRACTOR_COLUMNS, attractors),
        "items": write_items(out_dir / "agreement_items.csv", items, encoded, scores),
    }
    title = f"{run.dir.name} (step {meta['step']})"
    md = out_dir / "agreement_table5.md"
    md.write_text(markdown(table, title))
    png5 = plot_table5(table, title, out_dir / "agreement_table5.png")
    png8 = plot_attractors(attractors, title, out_dir / "agreement_attractors.png")
    marvin = [s for item, s in zip(items, scores, strict=True) if item.kind == "marvin" and s is not None]
    headline = {
        "items": len(items),
        "skipped": sum(s is None for s in scores),
        # Marvin & Linzen accuracy over every scored item (micro average of Table 5's rows)
        "table5_accuracy": round(100.0 * sum(g > b for g, b in marvin) / len(marvin), 2) if marvin else None,
        **{f"attractors={r['attractors']}": r["accuracy"] for r in attractors},
    }
    # the scored items behind each accuracy of the headline (an accuracy of 2 items is not one to read)
    scored = {"table5_accuracy": len(marvin), **{f"attractors={r['attractors']}": _n(r) for r in attractors}}
    return {
        "plot_table5": str(png5),
        "plot_attractors": str(png8),
        "table5_markdown": str(md),
        **{k: str(v) for k, v in paths_out.items()},
        "headline": headline,
        "scored": scored,
    }


# ----------------------------------------------------------------------------- outputs


def write_items(path: Path, items: list[Item], encoded: list[dict], scores: list) -> Path:
    """One row per item: its scores and whether it was right, or why it was skipped."""
    rows = []
    for item, e, s in zip(items, encoded, scores, strict=True):
        rows.append(
            {
                "kind": item.kind,
                "condition": item.condition,
                "sentence": f"{item.pre} [MASK] {item.post}",
                "good": item.good,
                "bad": item.bad,
                "score_good": s[0] if s else "",
                "score_bad": s[1] if s else "",
                "correct": int(s[0] > s[1]) if s else "",
                "skipped": e["skip"] or "",
            }
        )
    cols = ("kind", "condition", "sentence", "good", "bad", "score_good", "score_bad", "correct", "skipped")
    return write_csv(path, cols, rows)


def _fmt(v) -> str:
    return "–" if v is None else f"{v:.1f}"


def markdown(table: list[dict], name: str) -> str:
    head = ["", f"ours: {name}", "BiGS (paper)", "BERT (paper)", "LSTM (paper)", "items (skipped)"]
    rows, group = [], None
    for r in table:
        if r["phenomenon"] != group:
            group = r["phenomenon"]
            rows.append([f"**{group.upper()}**", "", "", "", "", ""])
        rows.append(
            [r["label"], *(_fmt(r[k]) for k in ("accuracy", "paper_bigs", "paper_bert", "paper_lstm"))]
            + [f"{r['items']} ({r['skipped']})"]
        )
    return "\n".join(markdown_table(head, rows, align="lrrrrr")) + "\n"


def _n(row: dict) -> int:
    """Scored items of a row (its items less the skipped ones)."""
    return row["items"] - row["skipped"]


def _group(row: dict) -> str:
    return {"subject-verb": "SV", "reflexive anaphora": "REFL"}.get(row["phenomenon"], "?")


def plot_table5(table: list[dict], title: str, out: Path) -> Path:
    """Table 5 as horizontal bars: our accuracy beside the paper's BiGS and BERT, one group per condition. A
    condition with no scored item is left out (named under the figure); ours with fewer than MIN_ITEMS is grey
    and marked "too few to read", since an accuracy of two items says nothing beside the paper's."""
    import textwrap

    import numpy as np

    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    rows = [r for r in table if _n(r) > 0]
    left = [f"{_group(r)}: {r['label']}" for r in table if _n(r) == 0]
    labels = [f"{_group(r)}: {r['label']} (n={_n(r)})" for r in rows]
    note = textwrap.fill(f"left out, no item scored ({len(left)}): " + ", ".join(left), 150) if left else ""
    y = np.arange(len(rows))[::-1]
    height = 0.45 * max(len(rows), 2) + 2.0 + 0.15 * (note.count("\n") + 1)
    fig, ax = plt.subplots(figsize=(9, height))
    h = 0.27
    few = np.array([_n(r) < MIN_ITEMS for r in rows], bool)
    ours = np.array([np.nan if r["accuracy"] is None else r["accuracy"] for r in rows], float)
    if not few.all():
        ax.barh(y[~few] + h, ours[~few], height=h, color="tab:green", label="ours")
    if few.any():
        ax.barh(y[few] + h, ours[few], height=h, color="lightgray", label=f"ours, n < {MIN_ITEMS}: too few to read")
        for yi, r in zip(y[few], np.array(rows, dtype=object)[few], strict=True):
            ax.text(
                min(r["accuracy"] or 0, 60) + 1,
                yi + h,
                f"n = {_n(r)}, too few to read",
                va="center",
                fontsize=7,
                color="dimgray",
            )
    for k, (key, name, color) in enumerate(
        (("paper_bigs", "BiGS (paper)", "tab:red"), ("paper_bert", "BERT (paper)", "tab:blue")), start=1
    ):
        ax.barh(
            y + (1 - k) * h, [np.nan if r[key] is None else r[key] for r in rows], height=h, color=color, label=name
        )
    if not rows:
        ax.text(0.5, 0.5, "no Table 5 item could be scored", ha="center", va="center", transform=ax.transAxes)
    ax.set_yticks(y, labels)
    ax.set_ylim(-0.6, max(len(rows), 1) - 0.4)  # bars as thick for one condition as for thirteen
    ax.set_xlim(0, 100)
    ax.axvline(50, color="gray", ls=":", lw=1)
    ax.set_xlabel("accuracy (%): grammatical form scored above ungrammatical")
    ax.set_title(f"Marvin & Linzen agreement (BiGS Table 5): {title}")
    below = 0.05  # inches under the legend: the note on the conditions left out, if any
    if note:
        fig.text(0.01, 0.05 / height, note, fontsize=7, color="dimgray", va="bottom")
        below += 0.15 * (note.count("\n") + 1)
    if rows:
        fig.legend(loc="lower center", bbox_to_anchor=(0.5, below / height), ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, (below + 0.35) / height, 1, 1))  # the legend's row under the axes and their label
    return save_figure(fig, out)


def plot_attractors(rows: list[dict], title: str, out: Path) -> Path:
    """Figure 8: accuracy against the number of agreement attractors (items per point annotated)."""
    from ssmlm.analyze.plots import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    pts = [r for r in rows if r["accuracy"] is not None]
    if pts:
        ax.plot([r["attractors"] for r in pts], [r["accuracy"] for r in pts], "-", color="lightgray", zorder=1)
        few_label = f"ours, n < {MIN_ITEMS}: too few to read"
        for few, style in (
            (False, {"color": "tab:green", "label": "ours"}),
            (True, {"color": "lightgray", "label": few_label}),
        ):
            part = [r for r in pts if (_n(r) < MIN_ITEMS) == few]
            if part:
                ax.plot([r["attractors"] for r in part], [r["accuracy"] for r in part], "o", zorder=2, **style)
        for r in pts:
            ax.annotate(
                f"n={_n(r)}",
                (r["attractors"], r["accuracy"]),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=8,
                color="black" if _n(r) >= MIN_ITEMS else "dimgray",
            )
        ax.set_xticks(sorted({r["attractors"] for r in rows}))
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no attractor items scored", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylim(0, 110)  # room for the n= over a point at 100
    ax.axhline(50, color="gray", ls=":", lw=1)
    ax.set_xlabel("number of attractors")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Agreement attractors (BiGS Figure 8): {title}", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, out)
