"""A Python service leaking small objects: remember() keeps a record of each request (a tuple
of a short str and a float, all under 512 bytes) in the module-level list `seen`. Objects
that small never reach malloc: pymalloc carves them from 1 MiB arenas it mmaps, so the growth
shows as arenas and the page faults that first touch them, and only the Python stack at those
events says which line makes them (the list itself grows by 8 bytes a record: its item array
is malloc'd, a small share). usage: python3 pysmall.py [requests_per_second=20000]"""

import os
import sys
import time

seen = []


def remember(request_id: int) -> None:
    seen.append((f"req-{request_id}", request_id / 7))


def main() -> None:
    per_tick = max(1, (int(sys.argv[1]) if len(sys.argv) > 1 else 20000) // 10)
    print(f"ready {os.getpid()}", flush=True)
    request_id = 0
    while True:
        for _ in range(per_tick):
            remember(request_id)
            request_id += 1
        time.sleep(0.1)


main()
