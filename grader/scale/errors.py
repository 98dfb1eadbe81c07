"""The batch's own error: bad input to a batch, as opposed to a submission that cannot be graded."""


class BatchError(ValueError):
    """Bad input to the batch (the message says what was expected and what was found)."""
