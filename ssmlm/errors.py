"""User-facing errors: the CLI prints these as one line and exits non-zero, without a traceback."""


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
