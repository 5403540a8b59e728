"""Go: the runtime's own heap profile buckets and memory statistics read from a live program
(heap.py, its face; view.py: its facts, rows and sections), the function table and the runtime's
variables by version (pclntab.py, layout.py, memory.py), goroutine stacks (stacks.py) and the
trend of sampled figures (trend.py)."""
