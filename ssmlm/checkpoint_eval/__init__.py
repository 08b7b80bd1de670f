"""Evaluating a run's checkpoint: ``run`` (`ssmlm evaluate`: an encoder's objective or task, an LM's held-out
rows, on the batches train's parts build for a run's evaluations), ``lm`` (a language model's tasks), which
decodes through ``phonebook``, ``squad_gen`` and ``infilling``, and ``harness`` (the lm-evaluation-harness
adapter).

May import everything up to ssmlm.train (its parts) and ssmlm.evaluate's metrics and runner; experiment and
cli import it. Training never does: the loop evaluates through ssmlm.evaluate.runner.
"""
