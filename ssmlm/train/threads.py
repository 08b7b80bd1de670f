"""What runs beside the training loop's thread: the Ctrl-C / SIGTERM handler (``CtrlC``), work on a worker thread
that a Ctrl-C need not wait for (``interruptibly``), and the batch reader one step ahead (``Prefetcher``)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ssmlm import hosts
from ssmlm.train.hooks import Stopped

PREFETCH_DEPTH = 2  # batches read ahead of the step being trained


class CtrlC:
    """The first Ctrl-C only asks the loop to stop after the current step (it then saves a checkpoint);
    a KeyboardInterrupt raised at an arbitrary point could land inside an asynchronous checkpoint save
    or between a step and the assignment of its donated buffers. A second Ctrl-C interrupts at once.
    SIGTERM (`kill`, a batch scheduler's notice before it kills the job) is taken the same way."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __enter__(self):
        self.requested = self.forwarded = False
        self.previous = {}
        # Whether Ctrl-C reaches this object: signal handlers can only be set on the main thread.
        self.active = threading.current_thread() is threading.main_thread()
        # Several hosts stop together, at one step they agree on, or their collectives (the checkpoint's too) would
        # wait for each other forever: SIGTERM is left to jax's preemption notifier (it tells every host), and a
        # Ctrl-C becomes one (at_step asks whether the agreed step is reached).
        self.hosts = hosts.count()[1] > 1
        if self.active:
            signals = (signal.SIGINT,) if self.hosts else self.SIGNALS
            self.previous = {sig: signal.signal(sig, self._handle) for sig in signals}
        return self

    def _handle(self, signum, frame):
        if self.requested or self.forwarded:
            raise KeyboardInterrupt
        if self.hosts:
            self.forwarded = True
            os.kill(os.getpid(), signal.SIGTERM)
            return
        self.requested = True

    def at_step(self, step: int) -> None:
        """After every step, on every host: whether all hosts stop here (a no-op with one host)."""
        if self.hosts and hosts.agreed_stop(step):
            self.requested = True

    def __exit__(self, *exc):
        for sig, previous in self.previous.items():
            signal.signal(sig, previous)


def interruptibly(work: Callable[[], Any], ctrl_c: CtrlC | None) -> Any:
    """``work()`` on a worker thread while this one waits in short slices: Python runs a signal handler only
    between bytecodes of the main thread, so a Ctrl-C that lands in a compile or a long XLA call would otherwise
    wait for it. After a Ctrl-C this raises Stopped at once and leaves the worker to finish unobserved: the
    caller must not use its result or anything it changes."""
    if ctrl_c is None or not ctrl_c.active:
        return work()
    if ctrl_c.requested:
        raise Stopped
    done, box = threading.Event(), {}

    def target():
        try:
            box["result"] = work()
        except BaseException as e:  # handed to the waiting thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="ssmlm-interruptible", daemon=True).start()
    while not done.wait(0.05):
        if ctrl_c.requested:
            raise Stopped
    if "error" in box:
        raise box["error"]
    return box["result"]


class Prefetcher:
    """Reads the next batches on a background thread while the device computes the current one.

    Batches are a pure function of the step, so prefetching never changes what is trained on.
    """

    def __init__(self, batches: Callable[[int], Any], start: int, stop: int, depth: int = PREFETCH_DEPTH):
        self.batches, self.stop = batches, stop
        self.pool = ThreadPoolExecutor(max_workers=1)
        self.pending = {s: self.pool.submit(batches, s) for s in range(start, min(start + depth, stop))}
        self.depth = depth

    def next(self, step: int) -> dict:
        fut = self.pending.pop(step, None) or self.pool.submit(self.batches, step)
        ahead = step + self.depth
        if ahead < self.stop and ahead not in self.pending:
            self.pending[ahead] = self.pool.submit(self.batches, ahead)
        return fut.result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
