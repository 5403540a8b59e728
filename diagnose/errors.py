"""Typed errors of memdiag and the exit codes they map to (mapped in one place: cli.run)."""

from __future__ import annotations


class MemdiagError(Exception):
    """A failure to report as one line, without a traceback."""

    exit_code = 1


class UsageError(MemdiagError):
    """Bad input from the user: a dead pid, a path that is not a cgroup, an unwritable folder."""

    exit_code = 2


class PermissionNeeded(MemdiagError):
    """The diagnosis needs privileges this process does not have."""

    exit_code = 1
