"""memdiag's version, one home: the installed package's metadata (pyproject.toml's version), as
the report's footer and `memdiag --version` say it."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def memdiag_version() -> str:
    try:
        return version("memdiag")
    except PackageNotFoundError:
        return "unknown"
