"""serve's JSON answers show a target's bidi override (U+202E in its comm) and other format
characters as \\u escapes, as report.json does: the same values, nothing reordered in a viewer."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

from test_serve_handlers import AUTH, serve  # noqa: F401  (serve: the fixture)

COMM = "ok\u202eexe.txt"  # 12 bytes in UTF-8: the kernel keeps 15


def test_a_bidi_comm_is_escaped_in_the_incidents_json(serve):  # noqa: F811
    proc = subprocess.Popen(
        [sys.executable, "-c", f"open('/proc/self/comm', 'w').write({COMM!r}); print('ready', flush=True); input()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        client, _, worker = serve()
        r = client.post("/diagnose", json={"pid": proc.pid}, headers=AUTH)
        assert r.status_code == 202, r.text
        listed = client.get("/incidents", headers=AUTH)
    finally:
        proc.kill()
        proc.wait()
    raw = listed.content.decode()
    assert not [c for c in raw if unicodedata.category(c) == "Cf"], raw
    assert "ok\\u202eexe.txt" in raw
    (item,) = json.loads(raw)["incidents"]
    assert item["target"]["comm"] == COMM  # the value as it was
