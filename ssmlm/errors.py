"""User-facing errors: the CLI prints these as one line and exits non-zero, without a traceback."""

import re


class UserError(Exception):
    """A mistake the user can fix (bad recipe, missing file, unknown task). Message is one line."""


class RecipeError(UserError):
    pass


class DataError(UserError):
    pass


class CheckpointError(UserError):
    pass


class Interrupted(UserError):
    """Ctrl-C during training: a checkpoint was written; re-running the command resumes. Lives here, not in the
    training loop, so that the CLI can catch it without importing jax."""


class Diverged(UserError):
    """Training stopped because its steps kept failing (non-finite loss or gradient) or its weights became
    non-finite; the run's summary.json records it as failed, and an experiment does not reuse the run as done."""


# A Python object's repr inside a message (Orbax's restore error formats TensorStore's `spec` method instead of
# calling it: "See full TensorStore details: <bound method pybind11_...>"): noise where a reader wants a reason.
_REPR = re.compile(r"<(bound method|built-in method|function|[\w.]+ object at 0x)[^<>]*(>|$)")  # $: it goes on


def reason(e: BaseException, limit: int = 160) -> str:
    """An exception as one line for a message: its type and first line, object reprs dropped. Where a repr
    stood for the detail, the exception it was raised from (``raise ... from``) gives it."""
    line = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), "")
    if _REPR.search(line):
        line = re.sub(r"\.?\s*See full [\w ]*details:?\s*$", "", _REPR.sub("", line)).rstrip(" .:;")
        if e.__cause__ is not None:
            line = f"{line[:limit]}: {reason(e.__cause__, limit)}" if line else reason(e.__cause__, limit)
            limit *= 2
    line = line[:limit]
    if isinstance(e, UserError) or (type(e) is Exception and line):  # our own words, or a bare wrapper's
        return line
    return f"{type(e).__name__}: {line}" if line else type(e).__name__
