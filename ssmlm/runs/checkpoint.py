"""Orbax checkpoints of a run: parameters, optimizer state and a JSON manifest (step, data position,
metrics). Saves are asynchronous and committed atomically (Orbax writes to a temporary directory and
renames it), so an interrupted save never becomes the latest checkpoint.

Layout: RUN/checkpoints/<step>/{params, opt_state, meta[, controller]}; `controller` is the state of a
training-time controller (e.g. an objective mixture), when the stage has one.

A checkpoint damaged after the fact (truncated files, an emptied directory, missing items, shapes that do
not fit) is reported in one line and the next older one is used. A broken checkpoint is never deleted:
read-only commands leave it where it is; a resumed run moves it to RUN/broken-checkpoints/ so that
training can write that step again. A save cut short (a kill while Orbax wrote <step>.orbax-checkpoint-tmp) is
removed when training starts again, with one line saying so.

A run staged from a bucket (ssmlm.staging) keeps its checkpoints there: Orbax reads and writes gs://…/checkpoints
itself (through TensorStore), every process its own shards, so they are never copied to local disk. GCS has no
rename, so there Orbax marks a finished save with a commit_success.txt file in its step folder instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers as cm

from ssmlm import paths, staging
from ssmlm.errors import CheckpointError, reason
from ssmlm.models.layout import to_layout


@contextlib.contextmanager
def _quiet_orbax():
    """Orbax logs its own ERROR/WARNING lines (through absl) for a damaged checkpoint; we report it in one."""
    log = logging.getLogger("absl")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


UNFINISHED = ".orbax-checkpoint-tmp"  # the suffix of the folder Orbax writes a step to before it commits it


def _removed_unfinished(step: str) -> None:
    print(
        f"resume: removed the unfinished checkpoint at step {step} (interrupted while saving)",
        file=sys.stderr,
        flush=True,
    )


class _UnfinishedSaves(logging.Filter):
    """Orbax's own warning when it replaces a save cut short ("... Removing existing directory since it is not
    finalized"), as our one line; every other absl record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "since it is not finalized" not in message:
            return True
        step = re.search(r"(\d+)" + re.escape(UNFINISHED), message)
        _removed_unfinished(step[1] if step else "?")
        return False


def _quiet_unfinished_saves() -> None:
    absl = logging.getLogger("absl")
    if not any(isinstance(f, _UnfinishedSaves) for f in absl.filters):
        absl.addFilter(_UnfinishedSaves())


class _SaveFailures(logging.Filter):
    """Orbax's own tracebacks for a save that failed in its background threads (a full disk, a lost permission):
    kept here, not printed; the run reports the failure in one line (Checkpoints.poll / wait / close)."""

    def __init__(self):
        super().__init__()
        self.error: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or "orbax" not in record.pathname:
            return True
        if record.exc_info and record.exc_info[1] is not None and self.error is None:
            self.error = record.exc_info[1]
        return False


class _OrbaxTasks(logging.Filter):
    """asyncio's "Task exception was never retrieved" for Orbax's write tasks of a failed save (printed when they
    are collected, often at exit): that failure was reported in one line already."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "orbax" not in record.getMessage()


def _quiet_failed_saves() -> None:
    """A failed save's leftovers print nothing more (it is reported in one line): Orbax's write tasks that asyncio
    finds unretrieved, tensorstore's callbacks into Orbax's event loop once it is closed (they reach
    sys.unraisablehook while the save fails, before the failure is known), and coroutines never awaited at exit."""
    log = logging.getLogger("asyncio")
    if not any(isinstance(f, _OrbaxTasks) for f in log.filters):
        log.addFilter(_OrbaxTasks())
    warnings.filterwarnings("ignore", message="coroutine .*write_fragment.* was never awaited", category=RuntimeWarning)
    previous = sys.unraisablehook
    if getattr(previous, "quiets_orbax", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and "Event loop is closed" in str(error)):
            previous(unraisable)

    hook.quiets_orbax = True
    sys.unraisablehook = hook


def checkpoints_dir(run_dir: Path):
    """A run's checkpoints/ folder as Orbax takes it: absolute, or the bucket's for a staged run."""
    url = staging.checkpoints_url(run_dir)
    if url is None:
        return (Path(run_dir) / "checkpoints").resolve()  # Orbax needs absolute paths
    paths.filesystem(url)  # TensorStore pointed at the same server as gcsfs, before Orbax touches the bucket
    return epath.Path(url)


def _committed(step_dir) -> bool:
    if not (step_dir.name.isdigit() and step_dir.is_dir()):
        return False
    return isinstance(step_dir, Path) or (step_dir / "commit_success.txt").exists()


def _committed_in_bucket(url: str) -> list[int]:
    """The committed steps of a bucket's checkpoints/ (listed afresh: another host may have written since)."""
    steps = set()
    for key in paths.listing(url):
        parts = key[len(url.rstrip("/")) + 1 :].split("/")
        if len(parts) == 2 and parts[0].isdigit() and parts[1] == "commit_success.txt":
            steps.add(int(parts[0]))
    return sorted(steps)


def _rmtree(path) -> None:
    if isinstance(path, Path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.rmtree(missing_ok=True)


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written; the message says which step was kept and how to go on."""


def _key(path) -> str:
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)


def check_shapes(step_dir: Path, item: str, abstract) -> None:
    """Compare stored array shapes with the model's before restoring. Orbax reads arrays asynchronously and
    finds a mismatch mid-read, after which its pending reads fail noisily on a closed event loop."""
    stored = ocp.StandardCheckpointHandler().metadata(step_dir / item)
    have = {_key(p): tuple(m.shape) for p, m in jax.tree_util.tree_flatten_with_path(stored)[0] if hasattr(m, "shape")}
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        key = _key(path)
        if key in have and have[key] != tuple(leaf.shape):
            raise CheckpointError(f"does not fit the model: {item} {key} has shape {have[key]}, the model {leaf.shape}")


def restore_newest(run_dir: Path, steps: list[int], restore: Callable[[int], object], on_broken=None):
    """``restore(step)`` for the newest step that restores, with a one-line warning for each newer one that
    does not; ``on_broken(step)`` may move a broken one aside (and returns where to, for the warning).
    Returns (step, result); a CheckpointError when no step is usable."""
    failed: list[tuple[int, str]] = []
    for step in sorted(steps, reverse=True):
        try:
            with _quiet_orbax():
                result = restore(step)
        except Exception as e:  # Orbax, tensorstore and json raise many types for a damaged checkpoint
            failed.append((step, reason(e)))
            continue
        for bad, why in failed:
            moved = on_broken(bad) if on_broken else None
            where = f"; moved to {moved}" if moved else ""
            at = staging.location(run_dir)
            print(
                f"warning: checkpoint {bad} in {at} is unreadable ({why}){where}; using step {step}",
                file=sys.stderr,
                flush=True,
            )
        return step, result
    if not failed:
        raise CheckpointError(f"{run_dir}: holds no complete checkpoint")
    by_reason: dict[str, list[str]] = {}
    for s, why in failed:
        by_reason.setdefault(why, []).append(str(s))
    tried = "; ".join(f"{'steps' if len(s) > 1 else 'step'} {', '.join(s)}: {why}" for why, s in by_reason.items())
    raise CheckpointError(f"{run_dir}: no usable checkpoint ({tried})")


@dataclasses.dataclass(frozen=True)
class NewestBesides:
    """An Orbax preservation policy: every checkpoint at a step of ``kept`` (train.keep_steps), and the newest ``n``
    of the others (train.keep_checkpoints), so that kept steps take no place in the rotation."""

    n: int
    kept: frozenset[int] = frozenset()

    def should_preserve(self, checkpoints, *, context=None) -> list[bool]:
        others = sorted(c.step for c in checkpoints if c.step not in self.kept)
        newest = set(others[-self.n :]) if self.n > 0 else set()
        return [c.step in self.kept or c.step in newest for c in checkpoints]


class Checkpoints:
    def __init__(self, run_dir: Path, keep: int = 2, best: str | None = None, kept_steps=()):
        """Keep the newest ``keep`` checkpoints besides those at ``kept_steps`` (never deleted), plus the best one
        by validation metric ``best`` (lower is better for losses and perplexity, higher for everything else)."""
        self.run_dir = run_dir
        self.dir = checkpoints_dir(run_dir)
        self.best = best
        policy = NewestBesides(keep, frozenset(kept_steps))
        if best:
            lower = "loss" in best or "perplexity" in best
            policy = cm.AnyPreservationPolicy(
                [
                    policy,
                    cm.BestN(
                        get_metric_fn=lambda m: m[best], reverse=lower, n=1, keep_checkpoints_without_metrics=False
                    ),
                ]
            )
        opts = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=True, preservation_policy=policy)
        _quiet_unfinished_saves()
        _quiet_failed_saves()
        self._failures = _SaveFailures()
        logging.getLogger("absl").addFilter(self._failures)
        self._in_flight: int | None = None  # the step of the save not yet known to be committed
        self._failed = False  # a save failed (and was reported): closing reports nothing more
        self._remove_unfinished()
        with _quiet_orbax():  # it reads every step's metadata; a damaged one is reported by restore_newest
            self.mgr = ocp.CheckpointManager(self.dir, options=opts)

    def latest_step(self) -> int | None:
        return self.mgr.latest_step()

    def _remove_unfinished(self) -> None:
        """Remove the folders of saves a kill cut short (never a checkpoint: Orbax commits one by renaming its
        folder), before Orbax finds them and warns on its own."""
        if jax.process_index() != 0 or not self.dir.is_dir():
            return
        for path in sorted(self.dir.glob(f"*{UNFINISHED}*")):
            _rmtree(path)
            _removed_unfinished(path.name.split(".")[0])

    def save(self, step: int, params, opt_state, meta: dict, eval_metrics: dict | None = None, controller=None) -> None:
        """Start an asynchronous save of ``step`` (after the previous one is committed); a save that fails now or
        in the background is a CheckpointWriteError, raised here or by the next poll / wait / close."""
        items = dict(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            meta=ocp.args.JsonSave(meta),
        )
        if controller is not None:
            items["controller"] = ocp.args.StandardSave(controller)
        args = ocp.args.Composite(**items)
        metrics = eval_metrics if (self.best and eval_metrics and self.best in eval_metrics) else None
        with self._writing(step):
            self.mgr.save(step, args=args, force=True, metrics=metrics)
        self._in_flight = step
        if jax.process_index() == 0:
            staging.sync(self.run_dir)  # a staged run's records, as far as this checkpoint

    @contextlib.contextmanager
    def _writing(self, step: int | None):
        """Any failure of a save (Orbax's many error types: OSError, tensorstore's RESOURCE_EXHAUSTED, ...) as one
        CheckpointWriteError naming the newest committed step; a save that ended uncommitted is one too."""
        try:
            yield
        except CheckpointWriteError:
            raise
        except Exception as e:
            self._raise_failed(step if step is not None else self._in_flight, e)
        if self._failures.error is not None:
            self._raise_failed(self._in_flight, self._failures.error)

    def _check_committed(self) -> None:
        """After the save in flight has finished: raise if its step was not committed."""
        step, self._in_flight = self._in_flight, None
        if step is not None and step not in self.committed_steps():
            self._in_flight = step
            self._raise_failed(step, self._failures.error)

    def _raise_failed(self, step: int | None, e: BaseException | None):
        self._in_flight, self._failed = None, True
        self._failures.error = None
        kept = [s for s in self.committed_steps() if s != step]
        why = f" ({reason(e)})" if e is not None else ""
        newest = f"the newest complete checkpoint, step {max(kept)}, is kept" if kept else "no checkpoint was kept"
        raise CheckpointWriteError(
            f"could not write the checkpoint of step {step} in {self.dir}{why}; {newest}; free space (or fix the "
            "permissions) and run the same command again to resume"
        ) from None

    def committed_steps(self) -> list[int]:
        """The steps whose checkpoint is complete on disk (Orbax commits a save by renaming its folder; in a bucket,
        where a rename is a copy, by writing its commit_success.txt last)."""
        if not isinstance(self.dir, Path):
            return _committed_in_bucket(str(self.dir))
        if not self.dir.is_dir():
            return []
        return sorted(int(p.name) for p in self.dir.iterdir() if _committed(p))

    def poll(self) -> None:
        """Without waiting: raise if the save in flight has failed (checked between steps, so a full disk stops
        the run at once rather than at the next save)."""
        if self._in_flight is None:
            return
        if self._failures.error is not None:
            self._raise_failed(self._in_flight, self._failures.error)
        if not self.mgr.is_saving_in_progress():
            with self._writing(None):
                self.mgr.wait_until_finished()  # finished: returns at once, or raises the save's error
            self._check_committed()

    def best_step(self) -> int | None:
        return self.mgr.best_step() if self.best else None

    def restore(self, step: int, abstract_params, abstract_opt_state, abstract_controller=None):
        """(params, opt_state, meta, controller state or None)."""
        check_shapes(self.dir / str(step), "params", abstract_params)
        check_shapes(self.dir / str(step), "opt_state", abstract_opt_state)
        items = dict(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.StandardRestore(abstract_opt_state),
            meta=ocp.args.JsonRestore(),
        )
        if abstract_controller is not None:
            items["controller"] = ocp.args.StandardRestore(abstract_controller)
        r = self.mgr.restore(step, args=ocp.args.Composite(**items))
        if not isinstance(r.meta, dict) or "step" not in r.meta:
            raise CheckpointError("its manifest has no step")
        return r.params, r.opt_state, r.meta, (r.controller if abstract_controller is not None else None)

    def restore_newest(self, abstract_params, abstract_opt_state, abstract_controller=None):
        """(step, (params, opt_state, meta, controller)) of the newest checkpoint that restores, or None when
        there is none.
        Newer broken ones are moved to RUN/broken-checkpoints/ (kept, not deleted), so training can save
        those steps again."""
        steps = list(self.mgr.all_steps())
        if not steps:
            return None
        restore = lambda step: self.restore(step, abstract_params, abstract_opt_state, abstract_controller)  # noqa: E731
        step, result = restore_newest(self.dir.parent, steps, restore, self._set_aside)
        self.mgr.reload()  # forget the steps just moved away
        return step, result

    def _set_aside(self, step: int) -> Path | None:
        if jax.process_index() != 0:  # one process moves it, on a shared file system
            return None
        if not isinstance(self.dir, Path):  # in the bucket: moved there (GCS copies each object)
            dest = f"{self.dir.parent}/broken-checkpoints/{step}.{int(time.time())}"
            paths.filesystem(dest).mv(str(self.dir / str(step)).split("://", 1)[1], dest.split("://", 1)[1], True)
            return dest
        dest_root = self.dir.parent / "broken-checkpoints"
        dest_root.mkdir(exist_ok=True)
        dest = dest_root / str(step)
        n = 1
        while dest.exists():  # the same step may break again on a later attempt
            dest, n = dest_root / f"{step}.{n}", n + 1
        shutil.move(str(self.dir / str(step)), dest)
        return dest

    def wait(self) -> None:
        with self._writing(None):
            self.mgr.wait_until_finished()
        self._check_committed()

    def close(self, wait: bool = True) -> None:
        """Wait for the save in flight and close. ``wait=False`` (a run of several hosts that failed): leave it,
        since its commit meets every host at a barrier, and a host that died never comes (Orbax would wait out its
        barrier timeout, minutes); the newest committed checkpoint stands."""
        if not wait:
            logging.getLogger("absl").removeFilter(self._failures)
            return
        try:
            if not self._failed:
                self.wait()
        finally:
            with contextlib.suppress(Exception):  # after a failed save Orbax may fail to close too: reported above
                self.mgr.close()
            logging.getLogger("absl").removeFilter(self._failures)


def load_params(run_dir: Path, abstract_params, step: int | None = None):
    """Parameters (and the manifest) of a run's newest usable (or given) checkpoint, without optimizer state.
    Nothing is moved or written: a broken newer checkpoint is reported and skipped."""
    ckpt_dir = checkpoints_dir(run_dir)
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no checkpoints/ directory; is this an ssmlm run directory?")
    # Read onto this process's first device, whatever mesh wrote the checkpoint.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    on_device = lambda tree: jax.tree.map(  # noqa: E731
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None) or device), tree
    )
    wanted = abstract_params

    with _quiet_orbax(), ocp.CheckpointManager(ckpt_dir) as mgr:

        def restore(s: int):
            # read in the layout the checkpoint was written in (unrolled or scanned blocks)
            stored = ocp.StandardCheckpointHandler().metadata(ckpt_dir / str(s) / "params")
            abstract_params = on_device(to_layout(wanted, stored))
            check_shapes(ckpt_dir / str(s), "params", abstract_params)
            args = ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params), meta=ocp.args.JsonRestore())
            r = mgr.restore(s, args=args)
            if not isinstance(r.meta, dict) or "step" not in r.meta:
                raise CheckpointError("its manifest has no step")
            return r

        steps = [step] if step is not None else list(mgr.all_steps())
        _, r = restore_newest(Path(run_dir), steps, restore)
    return to_layout(r.params, wanted), r.meta
