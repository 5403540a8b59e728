"""A client filling a Redis server over its unix socket: SET of a new 1 KiB value RATE times a
second, for ever (raw RESP, the standard library only). redis_fill.py SOCKET RATE"""

import os
import socket
import sys
import time


def main():
    path, rate = sys.argv[1], int(sys.argv[2])
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    value = b"v" * 1024
    print(f"ready {os.getpid()}", flush=True)
    n = 0
    while True:
        batch = []
        for _ in range(rate // 20):
            key = b"order:%d" % n
            batch.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value))
            n += 1
        s.sendall(b"".join(batch))
        got = 0
        while got < len(batch):
            got += s.recv(65536).count(b"+OK")
        time.sleep(0.05)


main()
