"""A price lookup memoised with functools.lru_cache(maxsize=4096), filled to its bound before the
ready line; then lookups of new keys evict old ones (a cache at its bound). pylru.py RATE"""

import functools
import os
import sys
import time


@functools.lru_cache(maxsize=4096)
def quote_price(sku):
    return {"sku": sku, "price": sku * 1.07, "text": "q" * 600}


def main():
    rate = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for sku in range(8192):
        quote_price(sku)
    print(f"ready {os.getpid()}", flush=True)
    sku = 8192
    while True:
        for _ in range(rate // 50):
            quote_price(sku)
            sku += 1
        time.sleep(0.02)


main()
