"""An order service whose error branch keeps what it should drop: handle_order() builds each
order's 16 KiB payload; one order in 5 fails validation, and the except branch appends the payload
to the module-level list `failed`, which nothing ever trims (held growth, not a leak: every
payload is still reachable from the global). The payload is a bytearray, so the 16 KiB buffer is
malloc'd by CPython's bytearray code and only the Python stack says which line asked for it.
usage: python3 pyorders.py [orders_per_second=200]"""

import os
import sys
import time

failed = []


class InvalidOrder(ValueError):
    pass


def validate(order_id: int, payload: bytearray) -> None:
    if order_id % 5 == 0:
        raise InvalidOrder(f"order {order_id}: bad checksum")


def handle_order(order_id: int) -> None:
    payload = bytearray(16384)
    payload[:16] = order_id.to_bytes(16, "little")
    try:
        validate(order_id, payload)
    except InvalidOrder:
        failed.append(payload)  # kept "for a retry" that never comes


def main() -> None:
    per_tick = max(1, (int(sys.argv[1]) if len(sys.argv) > 1 else 200) // 10)
    print(f"ready {os.getpid()}", flush=True)
    order_id = 0
    while True:
        for _ in range(per_tick):
            handle_order(order_id)
            order_id += 1
        time.sleep(0.1)


main()
