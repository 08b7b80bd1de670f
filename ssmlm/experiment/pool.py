"""The worker processes of ``--jobs`` > 1 and the signals that stop them: a Ctrl-C (SIGINT or SIGTERM) to the
parent reaches every worker exactly once, and a worker whose parent died stops its run with a checkpoint and exits.
"""

from __future__ import annotations

import contextlib
import threading
import time

from ssmlm.errors import Interrupted
from ssmlm.experiment.execute import RUNNING


def _worker_init() -> None:
    """A pool worker leaves the terminal's process group, so that a Ctrl-C reaches only the parent, which then
    passes exactly one SIGINT to every worker (stop after the current step, with a checkpoint; a second Ctrl-C
    stops them at once) — also when the signal was sent to the parent alone (`kill -INT`). If the parent dies, the
    worker stops the same way instead of finishing a run nobody waits for, and then exits: no parent will send it
    work or its exit sentinel."""
    import os
    import signal

    from ssmlm.targets import quiet_cuda_plugin

    quiet_cuda_plugin()  # as the parent did (ssmlm.cli.main): a worker is a fresh interpreter
    if hasattr(os, "setpgrp"):
        os.setpgrp()
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGINT)
        while RUNNING.is_set():  # the run checkpoints and returns
            time.sleep(0.2)
        os._exit(130)

    threading.Thread(target=watch, name="ssmlm-parent-watch", daemon=True).start()


@contextlib.contextmanager
def signals_as_ctrl_c():
    """SIGINT and SIGTERM (`kill -INT`, `kill`, a scheduler's notice) stop an experiment as Ctrl-C does: each running
    run after its step, with a checkpoint (a run in this process takes them itself; pool workers get SIGINT). SIGINT
    too is set here, because a job started with `&` from a script inherits it ignored, and `ssmlm pretrain` (its
    CtrlC) takes it all the same."""
    import signal

    main = threading.current_thread() is threading.main_thread()  # handlers can only be set there
    signals = (signal.SIGINT, signal.SIGTERM) if main else ()
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in signals}  # KeyboardInterrupt
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def signal_workers() -> None:
    import multiprocessing
    import os
    import signal

    for p in multiprocessing.active_children():  # the pool's workers: this process starts no others
        if p.pid is not None:
            os.kill(p.pid, signal.SIGINT)


def spawn_pool(workers: int):
    """``workers`` spawned processes (jax is not fork-safe), each out of the terminal's process group."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ctx = multiprocessing.get_context("spawn")
    return ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init)


@contextlib.contextmanager
def stop_on_interrupt(pool):
    """On Ctrl-C (or Interrupted) inside the block: every worker stops after its current step and writes a
    checkpoint, the pool is waited for (a second Ctrl-C: the workers stop at once), and the interrupt goes on."""
    try:
        yield
    except (Interrupted, KeyboardInterrupt):
        signal_workers()
        while True:
            try:
                pool.shutdown(wait=True, cancel_futures=True)
                break
            except KeyboardInterrupt:
                signal_workers()
        raise
