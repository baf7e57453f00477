"""Errors the `kiln` command reports as one clear line (no traceback); torch-free to import."""


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used: unreadable, or made for another model or data."""
