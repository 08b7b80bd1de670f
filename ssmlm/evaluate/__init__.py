"""Evaluation's building blocks: the metrics and result tables (pure functions of predictions and gold labels:
GLUE metrics, SQuAD EM/F1, phone-book retrieval) and the one evaluation runner (``runner``: a model's outputs on
host batches, scored) that the training loop, `ssmlm evaluate` and the analyses use.

May import ssmlm.errors, ssmlm.progress and ssmlm.models (a route's label in tables); data and objectives
import its scorers, train its runner. Evaluating a run's checkpoint is ssmlm.checkpoint_eval, above train.
"""
