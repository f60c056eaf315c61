"""The dashboard in a real browser: Debian's chromium, headless, driven by selenium.

Load the page, see a queue a test produced, pause it from the page (QSTAT says
paused), open a job and NACK it, requeue a dead-letter queue; a queue with
queued, delivered, delayed and dead jobs read at 800 px, each kind in its own
table with its own actions, the job page's times in units. A screenshot of
each run is saved in the test's directory; ``DASHBOARD_SCREENSHOT=path`` also
writes the queues view there (that is how docs/img/dashboard.png is made).
The module's tests share one node and one browser (each uses queues of its own).
"""

from __future__ import annotations

import os
import re
import shutil
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.httpclient import get, post
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


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    port = free_port()
    with NodeProc(tmp_path_factory.mktemp("dashboard") / "node", workers=2,
                  conf={"http-port": port}) as n:
        n.http_port = port  # type: ignore[attr-defined]
        yield n


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in FLAGS:
        opts.add_argument(flag)
    profile = tmp_path_factory.mktemp("chromium") / "chromium-profile"
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

    wait_until(lambda: "queued\n11" in queue_fields() and "pause\nnone" in queue_fields(),
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


def assert_no_sideways_scroll(browser: Any, widths: tuple[int, ...] = (1360, 800)) -> None:
    size = browser.get_window_size()
    try:
        for width in widths:
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


def test_the_job_page_shows_progress(node: NodeProc, browser: Any) -> None:
    """WORKING ... PROGRESS: the job page lists the value (only when one was given)."""
    r = node.client(protocol=2)
    q = unique_queue("progress")
    job_id = r.execute_command("ADDJOB", q, "x", 0, "RETRY", 60).decode()
    r.execute_command("GETJOB", "FROM", q)
    r.execute_command("WORKING", job_id, "PROGRESS", "3 of 10")
    browser.get(base(node) + "/#/job/" + urllib.parse.quote(job_id, safe=""))
    find(browser, "#job")
    assert_fields_read(browser, {"state": "active", "progress": "3 of 10"})


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


def test_queue_page_keeps_queued_active_delayed_and_dead_jobs_apart(node: NodeProc, browser: Any,
                                                                    tmp_path: Path) -> None:
    """At 800 px: each kind of job in its own table with its own actions (NACK for
    a delivered job only, "Run now" for a delayed one, a requeue per dead letter
    with its reason), counts that add up, times with their units, no broken word."""
    r = node.client(protocol=2)
    q = unique_queue("mixed")
    queued = produce(r, q, 2)
    delayed = [r.execute_command("ADDJOB", q, "later", 0, "DELAY", 600).decode() for _ in range(2)]
    [[_, active_id, _]] = r.execute_command("GETJOB", "FROM", q)
    active_id = active_id.decode()
    dead = [r.execute_command("ADDJOB", q, "poison", 0, "MAXDELIVER", 1).decode() for _ in range(2)]
    assert r.execute_command("DEADLETTER", dead[0], "REASON", "bad payload") == 1
    # dead[1] goes the MAXDELIVER way: its one delivery, then a NACK
    got = r.execute_command("GETJOB", "COUNT", 10, "NOHANG", "FROM", q)
    others = [e[1].decode() for e in got]
    assert dead[1] in others
    r.execute_command("NACK", dead[1])
    r.execute_command("NACK", *[i for i in others if i != dead[1]])  # back to queued
    assert r.execute_command("QLEN", "dead:" + q) == 2 and r.execute_command("QLEN", q) == 1

    browser.set_window_size(800, 900)
    try:
        browser.get(base(node) + "/#/queue/" + urllib.parse.quote(q, safe=""))
        find(browser, "#delayed-jobs")

        def ids_in(table: str) -> set[str]:
            return set(browser.execute_script(
                f"return [...document.querySelectorAll('#{table} tbody tr')].map(t => t.dataset.job);"))

        def actions_of(job_id: str) -> set[str]:
            return set(browser.execute_script(
                "return [...document.querySelectorAll('tr[data-job=\"' + arguments[0] + '\"] "
                "[data-action]')].map(b => b.dataset.action);", job_id))

        wait_until(lambda: ids_in("delayed-jobs") == set(delayed), wait_s, "the delayed jobs")
        assert ids_in("active-jobs") == {active_id}
        assert ids_in("queued-jobs") == set(queued) - {active_id}
        assert ids_in("dead-jobs") == set(dead)
        assert "nack" in actions_of(active_id) and "enqueue" not in actions_of(active_id)
        for job_id in delayed:
            assert "enqueue" in actions_of(job_id) and "nack" not in actions_of(job_id)
        for job_id in ids_in("queued-jobs"):
            assert not {"nack", "enqueue"} & actions_of(job_id)
        assert "requeue-job" in actions_of(dead[0])
        reasons = browser.execute_script(
            "return Object.fromEntries([...document.querySelectorAll('#dead-jobs tbody tr')]"
            ".map(t => [t.dataset.job, t.querySelector('[data-field=\"dead-reason\"]').innerText]));")
        assert reasons == {dead[0]: "bad payload", dead[1]: "MAXDELIVER 1 reached"}
        fields = str(browser.execute_script("return document.querySelector('dl.fields').innerText;"))
        assert "active (delivered, not acked)\n1" in fields
        assert "delayed (DELAY not over)\n2" in fields and "dead letters\n2" in fields
        assert_no_broken_words(browser)
        assert_no_sideways_scroll(browser, (800,))
        wide = browser.execute_script(  # the job tables fit their cards: no scroll inside either
            "return [...document.querySelectorAll('table.jobs')].filter(t => "
            "t.parentElement.scrollWidth > t.parentElement.clientWidth).map(t => t.id);")
        assert wide == [], wide
        browser.save_screenshot(str(tmp_path / "queue-800.png"))

        # "Run now" on a delayed job queues it (ENQUEUE); one dead letter back, the other stays
        click(browser, f"button[data-action=enqueue][data-job={css_str(delayed[0])}]")
        wait_until(lambda: job_field(r, delayed[0], b"state") == b"queued", wait_s, "queued now")
        click(browser, f"button[data-action=requeue-job][data-job={css_str(dead[0])}]")
        wait_until(lambda: job_field(r, dead[0], b"queue") == q.encode(), wait_s, "requeued")
        assert job_field(r, dead[1], b"queue") == b"dead:" + q.encode()

        # the job page of a delayed job: a creation date, durations with units
        browser.get(base(node) + "/#/job/" + urllib.parse.quote(delayed[1], safe=""))
        find(browser, "#job")
        assert "delayed" in browser.find_element("css selector", "#job-state").text

        def dd(name: str) -> str:
            return str(browser.find_element("css selector", f"#job dd[data-field={css_str(name)}]").text)

        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s ago\)", dd("ctime")), dd("ctime")
        assert dd("ttl") in ("1 d left", "23 h 59 min left"), dd("ttl")
        assert dd("delay") == "10 min" and dd("retry") == "5 min"
        assert re.fullmatch(r"in (9 min( \d+ s)?|10 min)", dd("next-requeue-within")), dd("next-requeue-within")
        assert not browser.find_elements("css selector", "#job button[data-action=nack]")
        assert browser.find_elements("css selector", "#job button[data-action=enqueue]")
        assert_no_broken_words(browser)
        browser.save_screenshot(str(tmp_path / "job-800.png"))

        # the queues view: counts that add up to the overview's
        browser.get(base(node) + "/")
        find(browser, f"tr[data-queue={css_str(q)}]")
        assert_no_broken_words(browser)

        def counts() -> tuple[int, str]:
            return browser.execute_script(
                "const s = [...document.querySelectorAll('#overview .stat')].find(e => /^queues?$/"
                ".test(e.querySelector('span').innerText));"
                "return [Number(s.querySelector('b').innerText.replace(/,/g, '')),"
                " document.getElementById('queue-count').innerText];")

        total, text = counts()
        listed = [int(n) for n in re.findall(r"(\d+) (?:dead-letter )?queues?", text)]
        assert sum(listed) == total and len(listed) == 2, (total, text)
    finally:
        browser.set_window_size(1360, 900)


def test_search_by_job_id_and_the_page_before_its_scripts_run(node: NodeProc, browser: Any) -> None:
    r = node.client(protocol=2)
    job_id = r.execute_command("ADDJOB", unique_queue("find"), "x", 0).decode()
    html = get(int(node.http_port), "/").body.decode()  # type: ignore[attr-defined]
    assert 'id="loading"' in html and "Loading" in html  # what shows before app.js runs
    browser.get(base(node) + "/")
    box = find(browser, "#job-id")
    box.send_keys("not an id")
    find(browser, "#job-search button").click()
    wait_until(lambda: "Not a job ID" in browser.find_element("css selector", "#flash").text,
               wait_s, "a bad ID refused")
    box.clear()
    box.send_keys(job_id)
    find(browser, "#job-search button").click()
    find(browser, "#job")
    assert job_id in browser.find_element("css selector", "#job h1").text
    unknown = "D-00000000-" + "A" * 24 + "-05a1"
    box = find(browser, "#job-id")
    box.send_keys(unknown)
    find(browser, "#job-search button").click()
    wait_until(lambda: "unknown job" in str(browser.execute_script(
        "const e = document.getElementById('error'); return e ? e.innerText : '';")),
        wait_s, "the page says the node knows no such job")


def click(browser: Any, css: str) -> None:
    """Click in one script: a live view redraws every 2 s, so an element found by
    one call may be gone by the next."""
    wait_until(lambda: browser.execute_script(
        "const e = document.querySelector(arguments[0]); if (e) e.click(); return !!e;", css),
        wait_s, f"{css} to click")


def job_field(r: Any, job_id: str, name: bytes) -> Any:
    raw = r.execute_command("SHOW", job_id)
    return dict(zip(raw[::2], raw[1::2], strict=True)).get(name) if raw else None


def assert_no_broken_words(browser: Any) -> None:
    """No header, label, button or badge breaks over two lines ("BOD Y")."""
    broken = browser.execute_script(r"""
        const out = [];
        for (const e of document.querySelectorAll('th, dt, button, .badge, .stat span, nav a, h1, h2')) {
          if (!e.innerText.trim() || e.closest('[hidden]')) continue;
          for (const t of e.childNodes) {
            if (t.nodeType !== Node.TEXT_NODE || !t.textContent.trim()) continue;
            for (const word of t.textContent.split(/\s+/).filter(Boolean)) {
              const at = t.textContent.indexOf(word);
              const range = document.createRange();
              range.setStart(t, at); range.setEnd(t, at + word.length);
              const tops = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
              if (tops.size > 1) out.push(word);
            }
          }
        }
        return out;""")
    assert broken == [], broken


def test_queue_limits_set_and_removed_from_the_page(node: NodeProc, browser: Any) -> None:
    """QLIMIT from the queue page: what is set and in use, a value typed survives the
    view's redraws, Save sets it on the node, Remove takes it away."""
    import redis

    r = node.client(protocol=2)
    q = unique_queue("limited")
    try:
        r.execute_command("QLIMIT", q)
    except redis.ResponseError as e:
        pytest.skip(f"this node has no QLIMIT ({e})")
    produce(r, q, 3)
    r.execute_command("GETJOB", "FROM", q)  # one delivered: in use

    def limits() -> dict[bytes, Any]:
        raw = r.execute_command("QLIMIT", q)
        return dict(zip(raw[::2], raw[1::2], strict=True))

    browser.get(base(node) + "/#/queue/" + urllib.parse.quote(q, safe=""))
    find(browser, "#limit-active")
    browser.execute_script(
        "const e = document.getElementById('limit-active'); e.value = '2';"
        "e.dispatchEvent(new Event('input')); document.getElementById('limits').dataset.old = '1';")
    wait_until(lambda: browser.execute_script(  # the view redrew: a new card, the value kept
        "const c = document.getElementById('limits'); return !!c && !c.dataset.old;"), wait_s, "a redraw")
    assert browser.execute_script("return document.getElementById('limit-active').value;") == "2"
    click(browser, "button[data-action=limits-save]")
    wait_until(lambda: limits()[b"active"] == 2, wait_s, "QLIMIT ACTIVE 2 on the node")
    wait_until(lambda: browser.execute_script(
        "const d = document.querySelector('#limits dd[data-limit=active]'); return d ? d.innerText : '';")
        == "2 · 1 in use", wait_s, "the page shows the limit and its use")
    assert_no_broken_words(browser)
    click(browser, "button[data-action=limits-reset]")
    wait_until(lambda: limits()[b"active"] == 0, wait_s, "the limit removed")
