"""The trainer's error types: a problem reported as one line, with the exit status it ends the run with."""


class TrainError(Exception):
    """Bad options, data or checkpoint; ``python -m train`` prints it and exits with status 2."""

    status = 2


class MachineError(TrainError):
    """A failure of the machine, not of the setup (a full disk, an I/O error while saving): one line like every
    TrainError, exit status 1, as ``python -m convert`` gives a failure of the machine (``convert.cli``)."""

    status = 1
