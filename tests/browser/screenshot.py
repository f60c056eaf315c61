"""Make the README's dashboard screenshot: a node with a few busy queues, the page
open in headless chromium for a few refreshes, then a PNG.

    python -m tests.browser.screenshot docs/img/dashboard.png

Producers and a consumer run in threads while the page refreshes, so the queues
table and the rate chart show live traffic.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from tests.browser.test_dashboard import CHROMEDRIVER, CHROMIUM, FLAGS
from tests.httpclient import post
from tests.nodeproc import NodeProc, free_port

QUEUES = (("orders", 40, 30), ("emails", 25, 22), ("thumbnails", 60, 20), ("webhooks", 8, 8),
          ("reports", 3, 0))
traffic_s = 24.0  # long enough for the chart to fill a few points


def traffic(port: int, queue: str, add_per_s: int, take_per_s: int, stop: threading.Event) -> None:
    import redis

    r = redis.Redis(port=port, protocol=2)
    i = 0
    while not stop.is_set():
        for _ in range(add_per_s // 4):
            r.execute_command("ADDJOB", queue, f'{{"id": {i}, "kind": "{queue}"}}', 0)
            i += 1
        for _ in range(take_per_s // 4):
            got = r.execute_command("GETJOB", "NOHANG", "FROM", queue)
            if got and i % 7:  # a few stay delivered and unacknowledged: "active"
                r.execute_command("ACKJOB", got[0][1])
        stop.wait(0.25)
    r.close()


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "docs/img/dashboard.png").resolve()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    http_port = free_port()
    with tempfile.TemporaryDirectory() as tmp, \
            NodeProc(Path(tmp) / "node", workers=2, conf={"http-port": http_port}) as node:
        r = node.client(protocol=2)
        for q, _, _ in QUEUES:
            r.execute_command("ADDJOB", q, "{}", 0)
        stop = threading.Event()
        threads = [threading.Thread(target=traffic, args=(node.port, q, a, t, stop), daemon=True)
                   for q, a, t in QUEUES]
        for t in threads:
            t.start()
        r.execute_command("PAUSE", "reports", "out")
        for _ in range(3):  # waiting for their DELAY: "delayed", apart from "active"
            r.execute_command("ADDJOB", "reports", '{"kind": "nightly"}', 0, "DELAY", 3600)
        for _ in range(2):
            [[_, jid, _]] = r.execute_command("GETJOB", "FROM", "webhooks")
            post(http_port, "/api/jobs/" + jid.decode().replace("/", "%2F") + "/dead")
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM
        for flag in FLAGS:
            opts.add_argument(flag)
        opts.add_argument(f"--user-data-dir={tmp}/profile")
        driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
        try:
            driver.get(f"http://127.0.0.1:{http_port}/")
            time.sleep(traffic_s)
            driver.save_screenshot(str(out))
        finally:
            driver.quit()
            stop.set()
            for t in threads:
                t.join(timeout=10)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
