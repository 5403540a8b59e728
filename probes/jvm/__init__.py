"""A HotSpot JVM's own instruments, driven by memdiag: its attach socket (attach.py), a flight
recording of its memory events (jfr.py) and what the recording says (recording.py)."""
