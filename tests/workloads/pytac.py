"""Runs orders.tac the way `twistd -y` runs a .tac (twisted.persisted.sob.loadValueFromFile): its
source exec()'d in a dict holding only __file__, not imported, then serves orders through the
function it defined. usage: python3 pytac.py [orders_per_second=200]"""

import os
import sys
import time
from pathlib import Path


def load():
    tac = Path(__file__).with_name("orders.tac")
    namespace = {"__file__": str(tac)}
    exec(compile(tac.read_text(), str(tac), "exec"), namespace)
    return namespace["handle_order"]  # the namespace stays held by the function's __globals__ alone


def main() -> None:
    handle_order = load()
    per_tick = max(1, (int(sys.argv[1]) if len(sys.argv) > 1 else 200) // 10)
    print(f"ready {os.getpid()}", flush=True)
    order_id = 0
    while True:
        for _ in range(per_tick):
            handle_order(order_id)
            order_id += 1
        time.sleep(0.1)


main()
