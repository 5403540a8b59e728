"""Typed errors of memdiag and the exit codes they map to (mapped in one place: cli.run)."""

from __future__ import annotations


class MemdiagError(Exception):
    """A failure to report as one line, without a traceback."""

    exit_code = 1


class UsageError(MemdiagError):
    """Bad input from the user: a dead pid, a path that is not a cgroup, an unwritable folder."""

    exit_code = 2


class UnknownTarget(UsageError):
    """A container or pod reference that names nothing on this host (serve: 404)."""


class AmbiguousTarget(UsageError):
    """A container or pod reference that names more than one (serve: 422); the message lists them."""


class PermissionNeeded(MemdiagError):
    """The diagnosis needs privileges this process does not have."""

    exit_code = 1


class SignalInterrupted(MemdiagError):
    """SIGINT or SIGTERM ended the command early (after its partial output was written); the exit
    code is the shell's for that signal, 128 + its number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum
