"""Fact readers: pure functions of a root path that parse the kernel's own files into frozen
pydantic models. Unknown values are ``None``, never 0: a missing counter is not a zero counter."""
