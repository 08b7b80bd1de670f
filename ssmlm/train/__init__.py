"""Training: the one loop (loop.py) with its hooks and controller, the optimizer and its parameter rules,
the device mesh and sharding, weight transfer between runs, the stage drivers that feed the loop
(pretrain / extend-length / finetune, stages.py), `evaluate` and `--dry-run` plans.

May import everything below it (models, data, objectives, runs, recipe, evaluate metrics). Never analyze or
cli: plots and reports attach to the loop as hooks from above.
"""
