"""A client of an HTTP server on 127.0.0.1:PORT: GET of its root (a folder listing) RATE times a second, each a
new connection, for ever. http_client.py PORT RATE"""

import http.client
import os
import sys
import time


def main():
    port, rate = int(sys.argv[1]), int(sys.argv[2])
    print(f"ready {os.getpid()}", flush=True)
    n = 0
    while True:
        for _ in range(max(1, rate // 10)):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/")
            c.getresponse().read()
            c.close()
            n += 1
        time.sleep(0.1)


main()
