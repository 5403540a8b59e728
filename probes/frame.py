"""One frame of a native stack as memdiag names it (`fn+0x1a [module]`, a frame with its
file:line `fn (orderd.c:16) [module]`, a compiler's clone named by its function with the clone as
a detail `fn+0x1a (GCC clone .isra.0) [module]`), apart from the symbolizer so that both it and
Go's function-table reader use it. docs/symbols.md says how frames are named."""

from __future__ import annotations

import os

from memdiag.system._parse import Model
from pydantic import ConfigDict

# The suffixes a compiler gives the copies it makes of a function, each `.word` or `.word.N`, in any
# combination (`process_order.constprop.0.isra.0`, `.constprop.0.cold`): GCC's interprocedural
# clones (isra: scalar replacement of aggregates, constprop: constant propagation, part: a split
# part, cold: the unlikely part moved away, lto_priv: a static made unique at link time,
# localalias, clone, specialize) and LLVM's (llvm.N: a local made global by ThinLTO, __uniq.N: a
# static made unique). The source has only the function's own name: that is what is shown.
_CLONE_WORDS = frozenset({"isra", "constprop", "part", "cold", "lto_priv", "localalias", "clone", "specialize"})
_CLONE_WORDS_LLVM = frozenset({"llvm", "__uniq"})


def split_clone(name: str) -> tuple[str, str | None]:
    """(the function's own name, the clone suffix or None): `process_order.isra.0` ->
    (`process_order`, `.isra.0`); a mangled name's suffix too (`_Z4takel.cold` -> `_Z4takel`).
    Read from the end, a dot-separated word at a time (linear: a regex searched from every dot of
    a long name made of suffix-like words took quadratic time on a target's symbol)."""
    words = name.split(".")
    cut = len(words)
    i = len(words) - 1
    while i >= 1:
        if words[i].isascii() and words[i].isdigit() and i >= 2 and _clone_word(words[i - 1]):
            i -= 2  # `.word.N`
        elif _clone_word(words[i]):
            i -= 1  # `.word`
        else:
            break
        cut = i + 1
    own = ".".join(words[:cut])
    if cut == len(words) or not own:  # no suffix, or nothing before it to fold it into
        return name, None
    return own, name[len(own) :]


def _clone_word(word: str) -> bool:
    return word in _CLONE_WORDS or word in _CLONE_WORDS_LLVM


def clone_label(clone: str) -> str:
    """How a frame says which copy it is: `GCC clone .isra.0`, `LLVM clone .llvm.1234`."""
    compiler = "LLVM" if clone.startswith((".llvm", ".__uniq")) else "GCC"
    return f"{compiler} clone {clone}"


class Frame(Model):
    model_config = ConfigDict(frozen=True)

    address: int
    function: str | None = None  # the function's own name (demangled, without a clone's suffix)
    offset: int | None = None  # from the start of the symbol (the clone's, for a clone)
    module: str | None = None
    # file:line: a Go frame's from its function table (inlined calls too), a native frame's from
    # its DWARF line table (probes/lines.py); or what a JIT frame is ("JIT code")
    source: str | None = None
    clone: str | None = None  # the compiler's clone suffix of the symbol (".isra.0"), if any

    @property
    def known(self) -> bool:
        return self.function is not None

    def __str__(self) -> str:
        mod = f" [{os.path.basename(self.module)}]" if self.module else ""
        if self.function is None:
            return f"[unknown]{mod}"
        details = [d for d in (self.source, clone_label(self.clone) if self.clone else None) if d]
        said = f" ({', '.join(details)})" if details else ""
        if self.source is not None or self.offset is None:
            return f"{self.function}{said}{mod}"
        return f"{self.function}+0x{self.offset:x}{said}{mod}"
