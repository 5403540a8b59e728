"""A Python service keeping an in-memory journal: log_entry() adds a small record per request (a
dict of a short str, an int and a tuple) to the module-level dict `journal`, keyed by a sequence
number its caller counts, and nothing ever removes one. Every object is under 512 bytes, so all of
it lives in pymalloc's 1 MiB arenas, which the interpreter maps for whichever line found the last
one full: the caller's `seq += 1` (an int the journal keeps as its key) as well as log_entry.
usage: python3 pyjournal.py [requests_per_second=4000]"""

import os
import sys
import time

journal = {}


def log_entry(seq: int) -> None:
    journal[seq] = {"who": f"client-{seq % 613}", "at": seq * 3, "path": ("/orders", seq)}


def main() -> None:
    per_tick = max(1, (int(sys.argv[1]) if len(sys.argv) > 1 else 4000) // 20)
    print(f"ready {os.getpid()}", flush=True)
    seq = 1000
    while True:
        for _ in range(per_tick):
            log_entry(seq)
            seq += 1
        time.sleep(0.05)


main()
