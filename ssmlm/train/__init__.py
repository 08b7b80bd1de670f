"""Training: the one loop (loop.py) with its hooks (hooks.py), logs (logs.py), controller timing (control.py)
and threads (threads.py), the optimizer and its parameter rules, the device mesh and sharding, weight transfer
between runs, the stage drivers that feed the loop (drive.py: pretrain / extend-length / finetune, with one parts
module per kind of work in parts/) and `--dry-run` plans (plan.py, aot.py, fit.py).

May import everything below it (models, evaluate's metrics and its runner, which the loop evaluates through,
data, objectives, recipe, runs). Never analyze, display, cli or ssmlm.checkpoint_eval (the evaluation of a run's
checkpoint, which builds on train's parts): plots and reports attach to the loop as hooks from above.
"""
