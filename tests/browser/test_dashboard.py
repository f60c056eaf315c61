"""The dashboard in a real browser: Debian's chromium, headless, driven by selenium.

Load the page, see a queue a test produced, pause it from the page (QSTAT says
paused), open a job and NACK it, requeue a dead-letter queue. A screenshot of
each run is saved in the test's directory; ``DASHBOARD_SCREENSHOT=path`` also
writes the queues view there (that is how docs/img/dashboard.png is made).
"""

from __future__ import annotations

import os
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.httpclient import post
from tests.nodeproc import NodeProc, free_port, unique_queue, wait_until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
wait_s = 30.0  # generous: the browser shares 2 cores with other test runs
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--window-size=1360,900")

pytestmark = pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason="Debian's chromium and chromium-driver are not installed (make sysdeps installs them)")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path / "node", workers=2, conf={"http-port": port}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    profile = tmp_path / "chromium-profile"
    opts.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    driver.set_page_load_timeout(wait_s)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def base(node: NodeProc) -> str:
    return f"http://127.0.0.1:{node.http_port}"  # type: ignore[attr-defined]


def find(driver: Any, css: str) -> Any:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, wait_s).until(ec.element_to_be_clickable((By.CSS_SELECTOR, css)))


def css_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def qstat(r: Any, q: str) -> dict[bytes, Any]:
    raw = r.execute_command("QSTAT", q)
    return dict(zip(raw[::2], raw[1::2], strict=True))


def produce(r: Any, q: str, n: int) -> list[str]:
    return [r.execute_command("ADDJOB", q, f'{{"order": {i}, "city": "Lyon"}}', 0).decode()
            for i in range(n)]


def test_dashboard_pause_nack_and_requeue(node: NodeProc, browser: Any, tmp_path: Path) -> None:
    r = node.client(protocol=2)
    q = unique_queue("orders")
    produce(r, q, 12)
    for other, n in (("emails", 5), ("thumbnails", 30)):
        produce(r, unique_queue(other), n)
    [[_, active_id, _]] = r.execute_command("GETJOB", "FROM", q)
    active_id = active_id.decode()

    # the queues view shows the queue a test produced, with its sizes
    browser.get(base(node) + "/")
    row = find(browser, f"tr[data-queue={css_str(q)}]")
    assert "11" in row.text  # queued
    wait_until(lambda: len(browser.find_elements("css selector", "#queues tbody tr")) >= 3, wait_s,
               "three queues listed")
    browser.save_screenshot(str(tmp_path / "queues.png"))
    target = os.environ.get("DASHBOARD_SCREENSHOT")
    if target:
        browser.save_screenshot(target)

    # pause it from the page: QSTAT reports it paused
    find(browser, f"button[data-action=pause][data-queue={css_str(q)}]").click()
    wait_until(lambda: qstat(r, q)[b"pause"] == b"all", wait_s, "QSTAT pause all")
    find(browser, f"button[data-action=resume][data-queue={css_str(q)}]").click()  # the page follows
    wait_until(lambda: qstat(r, q)[b"pause"] == b"none", wait_s, "QSTAT pause none")

    # open the queue (its fields read as text, the page does not scroll sideways),
    # then the active job, and NACK it
    browser.get(base(node) + "/#/queue/" + urllib.parse.quote(q, safe=""))
    find(browser, f"a[data-action=open][data-job={css_str(active_id)}]").click()
    find(browser, "#job")
    assert active_id in browser.find_element("css selector", "#job h1").text
    assert "active" in browser.find_element("css selector", "#job-state").text
    assert_fields_read(browser, {"queue": q, "state": "active", "nacks": "0", "repl": "1"})
    job_page = browser.current_url
    browser.get(base(node) + "/#/queue/" + urllib.parse.quote(q, safe=""))

    def queue_fields() -> str:  # read in one script: the view refreshes every 2 s
        return str(browser.execute_script(
            "const d = document.querySelector('dl.fields'); return d ? d.innerText : '';"))

    wait_until(lambda: "length\n11" in queue_fields() and "pause\nnone" in queue_fields(),
               wait_s, "the queue's fields as text")
    # the load signals QSTAT appends: one job delivered, none dead-lettered yet
    assert "active (delivered, not acked)\n1" in queue_fields()
    assert "dead letters\n0" in queue_fields()
    assert "[object" not in queue_fields()
    assert_no_sideways_scroll(browser)
    browser.get(job_page)  # not a click: the queue view redraws every 2 s under it
    find(browser, "#job")
    find(browser, f"button[data-action=nack][data-job={css_str(active_id)}]").click()

    def nacks() -> int:
        raw = r.execute_command("SHOW", active_id)
        return int(dict(zip(raw[::2], raw[1::2], strict=True))[b"nacks"])

    wait_until(lambda: nacks() == 1, wait_s, "SHOW nacks 1")
    browser.save_screenshot(str(tmp_path / "job.png"))

    # a dead-letter queue (filled through the API) requeued from the dead-letter view
    for job_id in [e[1].decode() for e in r.execute_command("QPEEK", q, 3)]:
        assert post(int(node.http_port), "/api/jobs/" + urllib.parse.quote(job_id, safe="") + "/dead").status == 200  # type: ignore[attr-defined]
    assert r.execute_command("QLEN", "dead:" + q) == 3
    before = r.execute_command("QLEN", q)
    browser.get(base(node) + "/#/dead")
    find(browser, f"button[data-action=requeue][data-queue={css_str('dead:' + q)}]").click()
    wait_until(lambda: (r.execute_command("QLEN", q), r.execute_command("QLEN", "dead:" + q))
               == (before + 3, 0), wait_s, "the jobs back in their queue")
    browser.save_screenshot(str(tmp_path / "dead.png"))


def assert_fields_read(browser: Any, want: dict[str, str]) -> None:
    """The job page's fields are text (not "[object HTMLElement]"), at two widths
    without a sideways scroll."""
    text = find(browser, "#job dl.fields").text
    assert "[object" not in text, text
    for name, value in want.items():
        cell = browser.find_element("css selector", f"#job dd[data-field={css_str(name)}]")
        assert cell.text == value, (name, cell.text)
    assert_no_sideways_scroll(browser)


def assert_no_sideways_scroll(browser: Any) -> None:
    size = browser.get_window_size()
    try:
        for width in (1360, 800):
            browser.set_window_size(width, 900)
            wide = browser.execute_script(
                "const d = document.documentElement; return [d.scrollWidth, d.clientWidth];")
            assert wide[0] <= wide[1], (width, wide)
    finally:
        browser.set_window_size(size["width"], size["height"])


def test_dashboard_is_usable_by_keyboard(node: NodeProc, browser: Any) -> None:
    from selenium.webdriver.common.keys import Keys

    r = node.client(protocol=2)
    q = unique_queue("kbd")
    produce(r, q, 2)
    browser.get(base(node) + "/")
    find(browser, f"tr[data-queue={css_str(q)}]")
    body = browser.find_element("css selector", "body")
    body.send_keys("/")
    assert browser.switch_to.active_element.get_attribute("id") == "filter"
    browser.switch_to.active_element.send_keys(q[-6:])
    wait_until(lambda: len(browser.find_elements("css selector", "#queues tbody tr[data-queue]")) == 1,
               wait_s, "the filter keeps one queue")
    browser.switch_to.active_element.send_keys(Keys.ESCAPE)
    body.click()
    body.send_keys("g", "n")
    find(browser, "#nodes")
    assert r.execute_command("CLUSTER", "MYID").decode() in browser.find_element("css selector", "#nodes").text


def test_dashboard_schedules_page(node: NodeProc, browser: Any) -> None:
    r = node.client(protocol=2)
    q = unique_queue("sched")
    r.execute_command("SCHEDULE", "SET", "nightly", "CRON", "30 2 * * *", "TZ", "Asia/Tokyo",
                      "ADDJOB", q, "body", "0")
    r.execute_command("SCHEDULE", "SET", "often", "EVERY", "1", "ADDJOB", q, "body", "0")
    wait_until(lambda: r.execute_command("QLEN", q) >= 1, wait_s, "a firing")
    browser.get(base(node) + "/#/schedules")
    row = find(browser, 'tr[data-schedule="nightly"]')
    cells = [c.text for c in row.find_elements("css selector", "td")]
    assert cells[:3] == ["nightly", 'CRON "30 2 * * *" TZ Asia/Tokyo', q]
    assert cells[3].endswith("17:30:00Z") and cells[4] == "–" and cells[8] == "yes"
    often = find(browser, 'tr[data-schedule="often"] td a[href^="#/job/"]')  # its last job
    often.click()
    find(browser, 'main[data-loaded="job"]')
    assert q in browser.find_element("css selector", "main").text
