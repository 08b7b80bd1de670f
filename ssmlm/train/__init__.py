"""Training: the one loop (loop.py) with its hooks and controller, the optimizer and its parameter rules,
the device mesh and sharding, weight transfer between runs, the stage drivers that feed the loop
(drive.py: pretrain / extend-length / finetune, with one parts module per kind of work in parts/),
`evaluate` and `--dry-run` plans.

May import everything below it (models, data, objectives, runs, recipe, evaluate metrics). Never analyze or
cli: plots and reports attach to the loop as hooks from above.
"""
