"""The admin in a real browser: headless Chromium against a live server.

Debian's ``chromium`` and ``chromium-driver`` packages are driven by
Selenium with the system chromedriver (no browser download). The test logs
in, opens the jobs list and a job's page, cancels a job, opens the
dashboard from the site index and from the app index (where "Dashboard" is
drawn on one line), reads each queue's split counts (due, scheduled,
retrying), its limits and what holds its due jobs back, and the workers'
slots, pauses and resumes a queue there and watches its figures refresh in
place (no reload; not while the tab is hidden; a failed fetch shown as
such), and replays a dead letter, checking the database after each action;
then opens a retried job's page, reads its attempts on the timeline and
makes it due with the page's own "Retry now" button;
it also tries a claim-token lookup (refused), and opens a task registry
row. Screenshots go to ``.test-results/screenshots/``; the dashboard's is
docs/images/dashboard.png, the job page's docs/images/job-attempts.png.

It runs in both passes: the actions go through different storage code on
each database (SQL functions on PostgreSQL, write transactions on SQLite),
and one browser session costs a few seconds.
"""

import datetime as dt
import os
import shutil
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.admin import live
from soniq_django.models import DeadLetterJob, Job, QueueSetting, TaskRegistration, Worker
from soniq_django.owned import OwnedJobSource
from soniq_django.throughput import ThroughputCounter
from tests.support.ci import unavailable
from tests.support.owned import nonce

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-quic", "--no-first-run", "--window-size=1600,1000")
SCREENSHOTS = Path(__file__).resolve().parents[2] / ".test-results" / "screenshots"
def _unavailable(reason: str):
    """Skip on a developer machine without the browser; fail under CI=true."""
    unavailable(f"{reason}: install Debian's chromium and chromium-driver (apt-get install "
                "chromium chromium-driver; scripts/run-tests does it when run as root)")


@pytest.fixture
def browser(tmp_path):
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("the selenium package is not installed")
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not (os.access(binary, os.X_OK) or shutil.which(Path(binary).name)):
            _unavailable(f"{binary} is missing")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM if os.access(CHROMIUM, os.X_OK) else shutil.which("chromium")
    for flag in (*FLAGS, f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver_path = CHROMEDRIVER if os.access(CHROMEDRIVER, os.X_OK) else shutil.which("chromedriver")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def shots(backend):
    """Save a screenshot as .test-results/screenshots/<backend>-<name>.png."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(driver, name: str, height: int = 1000) -> None:
        driver.set_window_size(1600, height)
        assert driver.save_screenshot(str(SCREENSHOTS / f"{backend}-{name}.png"))

    return save


def _claim(queue: str):
    return OwnedJobSource().claim_next_owned("worker-a", claim_token=nonce(), queues=[queue])


def _run_action(driver, action: str, job_id) -> str:
    """Tick ``job_id``, run ``action`` and return the message the next page shows."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    checkbox = f'input[name="_selected_action"][value="{job_id}"]'
    driver.find_element(By.CSS_SELECTOR, checkbox).click()
    Select(driver.find_element(By.NAME, "action")).select_by_value(action)
    page = driver.find_element(By.TAG_NAME, "html")
    driver.find_element(By.CSS_SELECTOR, 'button[name="index"]').click()
    _wait_replaced(driver, page)  # the action's page has replaced it
    wait = WebDriverWait(driver, 10)
    return wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))[0].text


def _press(driver, queue: str, action: str) -> str:
    """Click a queue's Pause/Resume button on the dashboard; the message the next page shows.

    The live refresh redraws the table every second, so a button found may be
    replaced before the click lands: find it again then.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    page = driver.find_element(By.TAG_NAME, "html")
    _redrawn_retry(lambda: driver.find_element(
        By.CSS_SELECTOR, f'tr[data-queue="{queue}"] button[value="{action}"]').click())
    _wait_replaced(driver, page)
    wait = WebDriverWait(driver, 10)
    return wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))[0].text


def _redrawn(error: Exception) -> bool:
    """Whether ``error`` says the element was replaced by a live redraw since it was found.

    Selenium raises StaleElementReferenceException for most of those; Chromium's
    click reports the same race as an inspector error on a node that left the document.
    """
    from selenium.common.exceptions import StaleElementReferenceException

    return (isinstance(error, StaleElementReferenceException)
            or "does not belong to the document" in str(error))


def _wait_replaced(driver, page) -> None:
    """Wait until the page ``page`` (its ``html`` element) has been replaced by the next one.

    Selenium's ``staleness_of`` asks the old element whether it is enabled and counts
    only StaleElementReferenceException as gone. While Chromium swaps the document it
    may answer with another error instead: an inspector error on a node that left the
    document (gone, too) or a passing one about the frame (asked again).
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    def replaced(_driver) -> bool:
        try:
            page.is_enabled()
        except WebDriverException as error:
            if _redrawn(error):
                return True
            raise
        return False

    WebDriverWait(driver, 10, ignored_exceptions=(WebDriverException,)).until(replaced)


def _redrawn_retry(action, tries: int = 10):
    """``action()``, tried again while a live redraw replaced its element under it."""
    from selenium.common.exceptions import WebDriverException

    for _ in range(tries - 1):
        try:
            return action()
        except WebDriverException as error:
            if not _redrawn(error):
                raise
    return action()


def _text(driver, css: str) -> str:
    """The text of the element at ``css``, read again if a live redraw replaced it meanwhile."""
    from selenium.webdriver.common.by import By

    return _redrawn_retry(lambda: driver.find_element(By.CSS_SELECTOR, css).text)


def _queued_cell(driver, queue: str) -> str:
    """The queue's count of queued jobs that are due now."""
    return _text(driver, f'tr[data-queue="{queue}"] td[data-status="due"]')


def _headings(driver, module: str) -> list[str]:
    """The column headings of a dashboard module's table, upper-cased (as the admin draws them)."""
    from selenium.webdriver.common.by import By

    return _redrawn_retry(lambda: [cell.text.upper() for cell in driver.find_elements(
        By.CSS_SELECTOR, f"#{module} thead th")])


def _cells(driver, queue: str) -> dict[str, str]:
    """The queue's row on the dashboard: each number by its data-status, and the last cells."""
    from selenium.webdriver.common.by import By

    def read() -> dict[str, str]:
        row = driver.find_element(By.CSS_SELECTOR, f'tr[data-queue="{queue}"]')
        found = {cell.get_attribute("data-status"): cell.text
                 for cell in row.find_elements(By.CSS_SELECTOR, "td[data-status]")}
        found["limits"] = row.find_element(By.CSS_SELECTOR, "td.limits").text
        found["held_back"] = row.find_element(By.CSS_SELECTOR, "td.held-back").text
        found["at_limit"] = ",".join(span.get_attribute("data-limit") for span in
                                     row.find_elements(By.CSS_SELECTOR, ".at-limit"))
        return found

    return _redrawn_retry(read)


def _dashboard_live(driver, shots, live_server) -> None:
    """Pause and resume a queue from the dashboard; watch a figure change without a reload."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, 20)
    url = live_server.url + reverse("admin:soniq_django_dashboard")
    assert driver.current_url == url

    # Pause "mail" with its button, and see it paused: in the database and on the page.
    assert _press(driver, "mail", "pause") == "Paused queue “mail”."
    row = QueueSetting.objects.get(queue="mail")
    assert (row.paused, row.paused_by) == (True, "admin")
    assert "Paused" in _text(driver, 'tr[data-queue="mail"]')

    # The figures refresh in place: a job enqueued now shows up, and the page is the same
    # page (a marker set on its window survives; a reload would drop it).
    driver.execute_script("window.soniqMarker = 'same page';")
    before = _queued_cell(driver, "mail")
    enqueue("shop.send_receipt", {"order": 43}, queue="mail")
    wait.until(lambda d: _queued_cell(d, "mail") == str(int(before) + 1))
    assert _cells(driver, "mail")["held_back"] == "paused"  # its worker serves it, and waits
    assert driver.execute_script("return window.soniqMarker;") == "same page"
    state = driver.find_element(By.ID, "soniq-live-state").text
    assert state.startswith("live: updated ") and len(state.split()[-1]) == 8, state
    shots(driver, "07-dashboard-live", height=1450)  # docs/images/dashboard.png is this one

    # While the tab is hidden it asks nothing; shown again, it asks at once.
    driver.execute_script("""
        window.soniqFetches = 0;
        var real = window.fetch;
        window.fetch = function () { window.soniqFetches += 1; return real.apply(this, arguments); };
        Object.defineProperty(document, "hidden", {configurable: true, get: function () {
            return window.soniqHidden === true; }});
        window.soniqHidden = true;
        document.dispatchEvent(new Event("visibilitychange"));
        window.soniqFetches = 0;
    """)
    time.sleep(3 * live.REFRESH_SECONDS)
    assert driver.execute_script("return window.soniqFetches;") == 0
    driver.execute_script("window.soniqHidden = false;"
                          "document.dispatchEvent(new Event('visibilitychange'));")
    wait.until(lambda d: d.execute_script("return window.soniqFetches;") >= 1)

    # A failed fetch says so, and the next good one clears it.
    driver.execute_script("""
        window.soniqRealFetch = window.fetch;
        window.fetch = function () { return Promise.reject(new Error("offline")); };
    """)
    wait.until(lambda d: "update failed" in d.find_element(By.ID, "soniq-live-state").text)
    assert "(offline)" in driver.find_element(By.ID, "soniq-live-state").text
    assert driver.find_element(By.ID, "soniq-dashboard").get_attribute("class") == "stale"
    driver.execute_script("window.fetch = window.soniqRealFetch;")
    wait.until(lambda d: d.find_element(By.ID, "soniq-live-state").text.startswith("live: "))
    assert driver.execute_script("return window.soniqMarker;") == "same page"

    # Resume it again.
    assert _press(driver, "mail", "resume") == "Resumed queue “mail”."
    assert not QueueSetting.objects.get(queue="mail").paused
    assert "Running" in _text(driver, 'tr[data-queue="mail"]')


def test_admin_in_a_browser(browser, shots, live_server, django_user_model, monkeypatch):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    assert "django.contrib.staticfiles" in settings.INSTALLED_APPS and settings.STATIC_URL, (
        "tests/settings.py must list django.contrib.staticfiles and set STATIC_URL: without "
        "STATIC_URL the live server fails every request, without staticfiles the admin has no CSS"
    )
    django_user_model.objects.create_superuser("admin", "admin@example.com", "pw-browser")
    monkeypatch.setattr(live, "REFRESH_SECONDS", 1)  # the live server runs in this process
    source = OwnedJobSource()
    queued = enqueue("shop.send_receipt", {"order": 41, "email": "a@example.com"}, queue="mail")
    enqueue("shop.send_receipt", {"order": 42}, queue="mail",
            run_at=timezone.now() + dt.timedelta(minutes=30))
    running = enqueue("reports.build", {"day": "2024-05-01", "regions": ["eu", "us"]},
                      queue="reports")
    assert _claim("reports").job_id == running
    token = Job.objects.get(id=running).claim_token
    done = enqueue("reports.build", {"day": "2024-04-30"}, queue="reports")
    assert source.complete_owned(_claim("reports").claim_fence, {"rows": 1200})
    dead = enqueue("billing.charge", {"amount": 5}, queue="billing")
    assert source.fail_owned(_claim("billing").claim_fence,
                             "Traceback (most recent call last):\n  ...\nValueError: declined",
                             retry=False)
    # Flow control: "reports" at its concurrency limit (1 of 1 running), a due job waiting;
    # "webhooks" at its rate limit (2 starts in the hour), one job retrying, one due.
    QueueSetting.objects.create(queue="reports", concurrency=1)
    enqueue("reports.build", {"day": "2024-05-02"}, queue="reports")
    QueueSetting.objects.create(queue="webhooks", rate_limit=2, rate_period=3600)
    for n in range(3):
        enqueue("webhooks.post", {"n": n}, queue="webhooks", max_attempts=5)
    retrying = _claim("webhooks")
    assert source.fail_owned(retrying.claim_fence, "HTTP 503", retry=True, retry_delay=600)
    assert source.complete_owned(_claim("webhooks").claim_fence, {"status": 200})
    web = Worker.objects.create(hostname="web-1", pid=321, queues=["mail", "reports"],
                                concurrency=4, version="soniq_django 0.9.0")
    TaskRegistration.objects.create(task_name="reports.build", worker_id=str(web.id),
                                    queue="reports", max_attempts=3,
                                    args_model_repr="BuildArgs(day: str, regions: list[str])")
    counter = ThroughputCounter()
    now = timezone.now()
    for minutes_ago, kind, count in ((1, "done", 6), (1, "failed", 1), (7, "done", 3),
                                     (20, "dead_lettered", 1), (35, "done", 9)):
        for _ in range(count):
            counter.add("reports", kind, now - dt.timedelta(minutes=minutes_ago))
    counter.flush("default")

    # Log in.
    browser.get(live_server.url + reverse("admin:login"))
    browser.find_element(By.NAME, "username").send_keys("admin")
    browser.find_element(By.NAME, "password").send_keys("pw-browser")
    browser.find_element(By.CSS_SELECTOR, 'input[type="submit"]').click()
    # Wait for the page after the login (the click does not wait for it).
    assert WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, "user-tools"))

    # The jobs list.
    browser.get(live_server.url + reverse("admin:soniq_django_job_changelist"))
    listed = browser.find_elements(By.CSS_SELECTOR, "#result_list tbody tr")
    assert len(listed) == 8  # 4, one more in "reports", three in "webhooks"
    assert "reports.build" in browser.page_source and token not in browser.page_source
    shots(browser, "01-jobs")

    # A running job's page: read-only, args pretty-printed, no claim token.
    browser.get(live_server.url + reverse("admin:soniq_django_job_change", args=[running]))
    pre = browser.find_element(By.CSS_SELECTOR, "pre")
    assert '"regions": [' in pre.text
    assert not browser.find_elements(By.NAME, "_save")
    assert token not in browser.page_source
    shots(browser, "02-job-detail", height=1900)

    # The token cannot be guessed through a changelist lookup either.
    browser.get(live_server.url + reverse("admin:soniq_django_job_changelist")
                + f"?claim_token__startswith={token[0]}")
    assert "Bad Request (400)" in browser.page_source and str(running) not in browser.page_source

    # Cancel the queued job from the list.
    browser.get(live_server.url + reverse("admin:soniq_django_job_changelist"))
    message = _run_action(browser, "cancel_selected", queued)
    assert message == "Cancelled 1 job."
    assert Job.objects.get(id=queued).status == "cancelled"
    shots(browser, "03-cancelled")

    # The dashboard, reached from the site index, and from the app index, where the link
    # is drawn on one line (not one letter a line, as a squeezed table cell drew it).
    dashboard = reverse("admin:soniq_django_dashboard")
    for index in (reverse("admin:index"), reverse("admin:app_list", args=["soniq_django"])):
        browser.get(live_server.url + index)
        link = browser.find_element(By.LINK_TEXT, "Dashboard")
        assert link.size["height"] < 30 and link.size["width"] > 50, (index, link.size)
    shots(browser, "04-app-index", height=700)
    link.click()
    assert browser.current_url.endswith(dashboard)
    assert browser.find_elements(By.CSS_SELECTOR, "#soniq-throughput svg rect.seg-done")
    workers = _text(browser, "#soniq-workers")
    assert "web-1" in workers and "soniq_django 0.9.0" in workers and "0 of 4" in workers
    assert "1 live worker: 0 of 4 slots in use." in workers
    headings = _headings(browser, "soniq-workers")
    assert "VERSION" in headings and "SLOTS IN USE" in headings and "RUNS" not in headings
    assert "permanent_failure" in browser.find_element(By.ID, "soniq-dead-letters").text

    # The queued jobs split, the limits and what holds the due jobs back.
    mail = _cells(browser, "mail")  # one job cancelled above, one for in half an hour
    assert (mail["due"], mail["scheduled"], mail["retrying"]) == ("0", "1", "0")
    assert mail["limits"] == "none" and mail["held_back"] == "-"
    reports = _cells(browser, "reports")
    assert (reports["due"], reports["processing"], reports["done"]) == ("1", "1", "1")
    assert reports["limits"] == "1 of 1 running" and reports["at_limit"] == "concurrency"
    assert reports["held_back"] == "at its concurrency limit"
    webhooks = _cells(browser, "webhooks")
    assert (webhooks["due"], webhooks["scheduled"], webhooks["retrying"]) == ("1", "0", "1")
    assert webhooks["limits"] == "2 of 2 started per 3600 s" and webhooks["at_limit"] == "rate"
    assert webhooks["held_back"] == "at its rate limit; no live worker serves it"
    headings = _headings(browser, "soniq-queues")
    for heading in ("DUE NOW", "SCHEDULED", "RETRYING", "LIMITS", "DUE JOBS HELD BACK BY"):
        assert heading in headings, headings
    shots(browser, "04-dashboard", height=1500)
    _dashboard_live(browser, shots, live_server)

    # The task registry, from the app index: filter by job name, open a row.
    browser.get(live_server.url + reverse("admin:app_list", args=["soniq_django"]))
    browser.find_element(By.LINK_TEXT, "Registered tasks").click()
    browser.find_element(By.CSS_SELECTOR,
                         '#changelist-filter a[href*="task_name=reports.build"]').click()
    assert "task_name=reports.build" in browser.current_url
    browser.find_element(By.CSS_SELECTOR, "#result_list tbody th a").click()
    pre = browser.find_element(By.CSS_SELECTOR, "pre")
    assert pre.text == "BuildArgs(day: str, regions: list[str])"
    assert not browser.find_elements(By.NAME, "_save")
    shots(browser, "05-registry-row")

    # Replay the dead letter.
    browser.get(live_server.url + reverse("admin:soniq_django_deadletterjob_changelist"))
    message = _run_action(browser, "replay_selected", dead)
    assert message == "Replayed 1 dead letter into the queue."
    assert Job.objects.get(id=dead).status == "queued"
    assert DeadLetterJob.objects.get(id=dead).resurrection_count == 1
    shots(browser, "06-replayed")
    assert Job.objects.get(id=done).status == "done"

    # A job's own page: its attempts on the timeline, and its actions as buttons.
    browser.get(live_server.url + reverse("admin:soniq_django_job_change",
                                          args=[retrying.job_id]))
    timeline = browser.find_element(By.CSS_SELECTOR, "table.soniq-timeline").text
    assert "Attempt 1: failed (retried)" in timeline and "HTTP 503" in timeline
    assert "Due again (retry)" in timeline
    buttons = browser.find_elements(By.CSS_SELECTOR, "form.soniq-page-action button")
    assert [button.text for button in buttons] == ["CANCEL", "RETRY NOW"]
    shots(browser, "07-job-attempts", height=1300)
    page = browser.find_element(By.TAG_NAME, "html")
    buttons[1].click()
    _wait_replaced(browser, page)
    assert WebDriverWait(browser, 10).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "ul.messagelist li"))[0].text == (
        "Made 1 waiting job due now.")
    assert browser.current_url.endswith(
        reverse("admin:soniq_django_job_change", args=[retrying.job_id]))
    assert Job.objects.get(id=retrying.job_id).scheduled_at <= timezone.now()
