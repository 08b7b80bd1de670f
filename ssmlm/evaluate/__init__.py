"""Evaluation: the metrics and result tables (pure functions of predictions and gold labels: GLUE metrics,
SQuAD EM/F1, phone-book retrieval), the one evaluation runner (``runner``: a model's outputs on host batches,
scored) that the training loop, `ssmlm evaluate` and the analyses use, and the evaluation of a run's checkpoint:
``run`` (`ssmlm evaluate`: an encoder's objective or task, an LM's held-out rows), ``lm`` (a language model's
tasks), which decode through ``phonebook``, ``squad_gen`` and ``infilling``.

Layers (tests/test_layering.py): the metrics, tables and ``runner`` sit low (objectives import the scorers, the
training loop the runner); the decoders sit above ssmlm.runs (they drive a run's generator); ``run`` and ``lm``
sit above ssmlm.train, whose parts build the held-out batches a run was evaluated on while it trained.
"""
