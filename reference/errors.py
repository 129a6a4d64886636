"""The one exception type for a model directory the reference refuses to load or run."""

from __future__ import annotations


class CheckpointError(ValueError):
    """A model directory is unusable: bad config, missing/misshapen/non-finite tensor, ...

    The message always names the offending key or tensor, so a user can fix the file.
    """
