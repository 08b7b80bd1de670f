"""Training: the one loop (loop.py) with its hooks (hooks.py), logs (logs.py), controller timing (control.py)
and threads (threads.py), the optimizer and its parameter rules, the device mesh and sharding, weight transfer
between runs, the stage drivers that feed the loop (drive.py: pretrain / extend-length / finetune, with one parts
module per kind of work in parts/), `--dry-run` plans and the lm-eval adapter (harness.py).

May import everything below it (models, data, objectives, runs, recipe, evaluate's metrics and its runner, which
the loop evaluates through). Never analyze, cli or the evaluation of a run's checkpoint (ssmlm.evaluate.run and
.lm, which build on train's parts): plots and reports attach to the loop as hooks from above.
"""
