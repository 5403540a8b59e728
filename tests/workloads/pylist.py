"""A Python program whose memory grows into a list: remember() keeps a 2 KiB bytearray per
request in a module-level list, about 200 KiB/s. Native stacks of its allocations name CPython's
functions (PyByteArray_*), never remember(): only its Python frames do. usage: python3 pylist.py
[per_second=100]"""

import os
import sys
import time

kept = []


def remember(i: int) -> None:
    kept.append(bytearray(2048) + str(i).encode())


def main() -> None:
    per_tick = max(1, int(sys.argv[1]) // 10 if len(sys.argv) > 1 else 10)
    print(f"ready {os.getpid()}", flush=True)
    i = 0
    while True:
        for _ in range(per_tick):
            remember(i)
            i += 1
        time.sleep(0.1)


main()
