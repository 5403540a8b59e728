"""One frame of a native stack as memdiag names it (`fn+0x1a [module]`, a Go frame with its
file:line), apart from the symbolizer so that both it and Go's function-table reader use it."""

from __future__ import annotations

import os

from memdiag.system._parse import Model
from pydantic import ConfigDict


class Frame(Model):
    model_config = ConfigDict(frozen=True)

    address: int
    function: str | None = None
    offset: int | None = None
    module: str | None = None
    source: str | None = None  # a Go frame's file:line (its function table says it; inlined calls too)

    @property
    def known(self) -> bool:
        return self.function is not None

    def __str__(self) -> str:
        mod = f" [{os.path.basename(self.module)}]" if self.module else ""
        if self.function is None:
            return f"[unknown]{mod}"
        if self.source is not None:
            return f"{self.function} ({self.source}){mod}"
        return f"{self.function}+0x{self.offset:x}{mod}"
