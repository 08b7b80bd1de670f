"""What a finetuning task is (TaskDef) and its loaded columns (TaskData): shared by the task registry
(ssmlm.data.tasks) and the readers of particular benchmarks (glue, squad, scrolls), so that neither imports
the other's module."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskDef:
    name: str
    text_fields: tuple[str, ...]
    label_field: str = "label"
    num_labels: int = 2  # 1 = regression
    metrics: tuple[str, ...] = ("accuracy",)
    hub: tuple[str, str] | None = None  # (dataset, config) on the Hugging Face hub
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "validation": "validation"})
    description: str = ""
    head: str = "classify"  # classify (pooler + classifier), span (start/end logits), choice (multiple choice)
    select: str | None = None  # metric that picks the best validation; None: see `selection`

    def __post_init__(self):
        if self.select is not None and self.select not in self.metrics:  # it must be a logged metric
            raise ValueError(f"task {self.name}: select '{self.select}' is not one of its metrics {self.metrics}")

    @property
    def selection(self) -> str:
        """The metric the best validation evaluation is chosen by (higher is better).

        ``select`` when given, else Spearman for a regression task that reports it (the GLUE / BiGS
        headline for STS-B, and what a local --num-labels 1 task gets), else the first metric. The rule
        matters because `load_task` rebuilds the definition without ``select``.
        """
        if self.select:
            return self.select
        if self.num_labels == 1 and "spearman" in self.metrics:
            return "spearman"
        return self.metrics[0]


@dataclass
class TaskData:
    definition: TaskDef
    splits: dict[str, dict[str, list]]  # split -> column -> values
    label_names: list | None = None  # a local task's label map: class id -> the label as its files spell it
    notes: list[str] = field(default_factory=list)  # what finetuning tells the user: the label map, a held-out split
