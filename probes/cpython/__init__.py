"""CPython targets read in Python's terms: the interpreter's layout by version (layout.py), where it
sits in a process (target.py), its memory read from outside and priced (memory.py), code objects to
function and file:line (code.py), the frames the BPF walk recorded at an event to a mixed
Python/native stack (frames.py), and a held block named by the Python object and the global that
hold it (holder.py). Nothing is ever written into the target."""
