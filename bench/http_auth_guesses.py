"""Wrong HTTP basic-auth passwords per second a guesser gets from a node: N
connections, each looping GET /metrics with a wrong password, for S seconds
(a node with ``requirepass`` and ``http-port``, started here; defaults otherwise).

    python -m bench.http_auth_guesses --connections 32 --seconds 5 --workers 2

docs/security.md ("Wrong HTTP passwords") has the figure.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

from tests.httpclient import get
from tests.nodeproc import NodeProc, free_port


def guesses_per_s(connections: int, seconds: float, workers: int) -> float:
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="authguess-") as d, \
            NodeProc(Path(d), workers=workers, conf={"http-port": port}) as n:
        r = n.client(protocol=2)
        r.execute_command("CONFIG", "SET", "requirepass", "the-right-one")
        r.close()
        stop = time.monotonic() + seconds
        counts = [0] * connections

        def guess(i: int) -> None:
            while time.monotonic() < stop:
                if get(port, "/metrics", password="wrong").status == 401:
                    counts[i] += 1

        threads = [threading.Thread(target=guess, args=(i,)) for i in range(connections)]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return sum(counts) / (time.monotonic() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    rate = guesses_per_s(args.connections, args.seconds, args.workers)
    print(f"{args.connections} connections, {args.workers} workers: "
          f"{rate:.1f} wrong HTTP passwords/s")


if __name__ == "__main__":
    main()
