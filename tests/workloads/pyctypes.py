"""A Python batch job that calls a C library through ctypes (drop.c, built as libdrop.so): process_batch() takes a
4 KiB record from take_record() and gives it back, but 1 in 7 takes loses its block inside the C
library (a native leak whose Python caller is process_batch). ctypes releases the GIL around the
call. usage: python3 pyctypes.py LIBRARY [records_per_second=1000]"""

import ctypes
import os
import sys
import time

lib = ctypes.CDLL(sys.argv[1])
lib.take_record.restype = ctypes.c_void_p
lib.take_record.argtypes = [ctypes.c_size_t]
lib.give_back.argtypes = [ctypes.c_void_p]


def process_batch(n: int) -> int:
    done = 0
    for _ in range(n):
        record = lib.take_record(4096)
        if record:
            lib.give_back(record)
            done += 1
    return done


def main() -> None:
    per_tick = max(1, (int(sys.argv[2]) if len(sys.argv) > 2 else 1000) // 10)
    print(f"ready {os.getpid()}", flush=True)
    while True:
        process_batch(per_tick)
        time.sleep(0.1)


main()
