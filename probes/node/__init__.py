"""Node: V8's heap against the memory outside it (heap.py, its face; view.py: its facts, rows and
sections)."""
