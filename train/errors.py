"""The trainer's one error type: a problem with the user's setup, reported as one line."""


class TrainError(Exception):
    """Bad options, data or checkpoint; ``python -m train`` prints it and exits with status 2."""
