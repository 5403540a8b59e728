"""An audit trail kept in memory: record_event appends every event to the module's EVENTS list,
which nothing ever trims (held growth). pyevents.py RATE"""

import os
import sys
import time

EVENTS = []


def record_event(n):
    EVENTS.append({"id": n, "who": f"user-{n % 977}", "what": "x" * 400, "tags": [n, n + 1, n + 2]})


def main():
    rate = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    print(f"ready {os.getpid()}", flush=True)
    n = 0
    while True:
        for _ in range(rate // 50):
            record_event(n)
            n += 1
        time.sleep(0.02)


main()
