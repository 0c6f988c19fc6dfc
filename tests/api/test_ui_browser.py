"""The web UI in a real headless browser: Debian's Chromium driven by Selenium through
Debian's chromedriver (no download: the driver's path is given, so Selenium Manager never
runs), against the API served for real, a worker process and the job runner on the loopback
test site.

A user logs in with the keyboard, creates a job from the form with YAML rules (tried first on
a page in the "try these rules" panel), watches it reach 100 %, opens a result and sees its
extracted data; a second, slow job's dead letter is replayed from its page and the job is
cancelled there. Screenshots of every main page, at a laptop's width and a phone's (390 px),
go to SCREENSHOT_DIR (else a pytest temporary folder); the path is printed. A missing Chromium
fails under CI=true (tests/helpers.py require_tool).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from common.api.auth import Tokens
from common.jobs.registry import JobRef, JobRegistry
from tests.helpers import output_of, require_tool, start_worker_process
from tests.jobs.test_runner import FAST_ENV, runner_thread

pytestmark = pytest.mark.slow

DESKTOP = (1280, 900)
PHONE = (390, 844)
SLOW_PAGES = 30
USER, PASSWORD = "operator", "correct horse battery"
RULES_YAML = """\
- name: pages
  path: '^/page/\\d+$'
  fields:
    heading: h1
    number: {css: h1, type: int, regex: '(\\d+)'}
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """One headless Chromium for the module (cookies cleared between tests)."""
    binary = require_tool("chromium")
    driver_path = require_tool("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # console: JS and CSP
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--no-first-run", "--disable-extensions", "--disable-background-networking",
                 f"--window-size={DESKTOP[0]},{DESKTOP[1]}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(driver_path))
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(os.environ.get("SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {folder}")
    return folder


@pytest.fixture
def ui(browser: WebDriver, api, settings) -> Iterator[WebDriver]:
    """The browser, logged out, at a laptop's size; a user of scope admin made. After the
    test, the console must show no script error and no refused content (the pages' policy)."""
    Tokens(api.client).add_user(USER, PASSWORD, "admin")
    browser.set_window_size(*DESKTOP)
    browser.get(api.url + "/login")
    browser.delete_all_cookies()
    browser.get_log("browser")  # what earlier tests left
    yield browser
    assert console_errors(browser) == []


def console_errors(driver: WebDriver) -> list[str]:
    """The console's errors but failed calls (a 401, 409 or 422 the page shows is expected)."""
    return [entry["message"] for entry in driver.get_log("browser")
            if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]]


#: Every text colour against the background it is drawn on, as the browser computes them:
#: [selector, text, ratio] for each visible element whose ratio is under WCAG AA's 4.5:1.
CONTRAST_JS = """
const rgb = (text) => (text.match(/[\\d.]+/g) || []).map(Number);
const lum = ([r, g, b]) => [r, g, b].map((c) => { c /= 255;
  return c <= 0.03928 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4; })
  .reduce((sum, c, i) => sum + c * [0.2126, 0.7152, 0.0722][i], 0);
const background = (node) => {
  for (; node && node.nodeType === 1; node = node.parentElement) {
    const c = rgb(getComputedStyle(node).backgroundColor);
    if (c.length === 3 || c[3] > 0.5) return c.slice(0, 3);
  }
  return [255, 255, 255];
};
const low = [];
for (const node of document.querySelectorAll("body *")) {
  const own = [...node.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
  const style = getComputedStyle(node);
  if (!own || !node.getClientRects().length || style.visibility === "hidden") continue;
  if (node.closest("[disabled], svg")) continue;  // disabled controls are exempt (WCAG 1.4.3)
  const [a, b] = [lum(rgb(style.color)), lum(background(node))];
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) low.push([node.tagName + "." + node.className, node.textContent.trim()
    .slice(0, 30), Math.round(ratio * 100) / 100]);
}
return low;
"""


def low_contrast(driver: WebDriver) -> list[list]:
    """The page's text under 4.5:1, after proving that the check finds a pale grey line."""
    driver.execute_script("const p = document.createElement('p'); p.id = 'pale';"
                          "p.textContent = 'pale'; p.style.color = '#bbbbbb';"
                          "document.body.append(p);")
    found = driver.execute_script(CONTRAST_JS)
    driver.execute_script("document.getElementById('pale').remove()")
    assert [row[1] for row in found if row[1] == "pale"] == ["pale"], found
    return [row for row in found if row[1] != "pale"]


@pytest.fixture
def fleet(settings) -> Iterator[None]:
    """A worker process (two pages at a time) and the job runner (in a thread), fast ticks."""
    worker = start_worker_process(settings, "--concurrency", "2", env=FAST_ENV)
    try:
        with runner_thread(settings):
            yield
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(20)
        except Exception:  # noqa: BLE001 - a worker stuck on its way out is killed
            worker.kill()
            worker.wait(10)
        print(output_of(worker)[-1500:])


def wait(driver: WebDriver, check, timeout_s: float = 20, what: str = ""):
    """Poll ``check(driver)`` until truthy (a stale element counts as not yet); on a timeout,
    the page's address and status line in the message."""
    try:
        return WebDriverWait(driver, timeout_s, 0.1, ignored_exceptions=(
            StaleElementReferenceException,)).until(check, what)
    except TimeoutException:
        shown = driver.find_elements(By.ID, "notice")
        raise TimeoutException(f"{what} (at {driver.current_url}; status line: "
                               f"{shown[0].text if shown else '-'!r})") from None


def text_of(driver: WebDriver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def shoot(driver: WebDriver, folder: Path, name: str) -> None:
    """A screenshot at the laptop size and one at the phone's; the page must not scroll
    sideways on the phone."""
    for label, size in (("desktop", DESKTOP), ("phone", PHONE)):
        driver.set_window_size(*size)
        driver.execute_script("window.scrollTo(0, 0)")
        height = driver.execute_script("return document.documentElement.scrollHeight")
        driver.set_window_size(size[0], max(size[1], min(int(height) + 140, 4000)))
        assert driver.save_screenshot(str(folder / f"{name}-{label}.png"))
        if label == "phone":
            width = driver.execute_script("return document.documentElement.scrollWidth")
            assert width <= size[0], f"{name} scrolls sideways on a phone: {width}px"
    driver.set_window_size(*DESKTOP)


def log_in_with_the_keyboard(driver: WebDriver, url: str) -> None:
    driver.get(url)
    wait(driver, lambda d: "/login" in d.current_url, what="redirected to the login page")
    user = driver.switch_to.active_element  # the user name field has the focus
    assert user.get_attribute("id") == "user"
    user.send_keys(USER, Keys.TAB)
    password = driver.switch_to.active_element
    assert password.get_attribute("id") == "password"
    outline = driver.execute_script(
        "return getComputedStyle(document.activeElement).outlineStyle")
    assert outline != "none", "the focused field shows no focus"
    password.send_keys(PASSWORD, Keys.ENTER)
    wait(driver, lambda d: "/login" not in d.current_url, what="logged in")


def fill(driver: WebDriver, element_id: str, text: str) -> None:
    field = driver.find_element(By.ID, element_id)
    field.clear()
    field.send_keys(text)


def test_a_user_logs_in_creates_a_job_from_the_form_watches_it_finish_and_opens_a_result(
        ui, api, site, fleet, shots):
    log_in_with_the_keyboard(ui, api.url + "/jobs/new")
    assert ui.current_url == api.url + "/jobs/new"
    shoot(ui, shots, "login-done-new-job-empty")

    fill(ui, "rules", RULES_YAML)
    fill(ui, "try-url", site.page_url(7))
    ui.find_element(By.CSS_SELECTOR, "#try-form button[type=submit]").click()
    wait(ui, lambda d: d.find_element(By.ID, "try-result").is_displayed(), what="try result")
    assert '"number": 7' in text_of(ui, "try-data") and "Page 7" in text_of(ui, "try-data")
    shoot(ui, shots, "new-job-tried")

    fill(ui, "name", "bad name")
    fill(ui, "depth", "-1")
    ui.find_element(By.CSS_SELECTOR, "#job-form button[type=submit]").click()
    wait(ui, lambda d: d.find_element(By.ID, "name-error").is_displayed(), what="name error")
    assert "name" in text_of(ui, "name-error")
    assert ui.find_element(By.ID, "name").get_attribute("aria-invalid") == "true"
    assert ui.switch_to.active_element.get_attribute("id") == "name"  # focus on the mistake
    shoot(ui, shots, "new-job-errors")
    assert low_contrast(ui) == []

    urls = [site.page_url(n) for n in range(1, 11)] + [site.url("/status/404")]
    fill(ui, "name", "shop")
    fill(ui, "depth", "")
    fill(ui, "seeds", "\n".join(urls))
    ui.find_element(By.CSS_SELECTOR, "#job-form button[type=submit]").click()
    wait(ui, lambda d: d.current_url == api.url + "/jobs/shop", what="the job's page")

    wait(ui, lambda d: text_of(d, "f-percent") == "100.0 %", 60, "100 %")
    wait(ui, lambda d: text_of(d, "job-state") == "finished", 30, "finished")
    assert text_of(ui, "f-done") == "11 / 11" and text_of(ui, "f-results") == "10"
    assert ui.find_element(By.ID, "job-bar").get_attribute("aria-valuenow") == "100"
    wait(ui, lambda d: len(d.find_elements(By.CSS_SELECTOR, "#results details")) == 10,
         what="ten results listed")
    wait(ui, lambda d: "404" in text_of(d, "errors"), what="the 404 under errors by reason")
    wait(ui, lambda d: site.url("/status/404") in text_of(d, "errors"), what="its example")
    wait(ui, lambda d: "/status/404" in text_of(d, "dead"), 30, "the 404 as a dead letter")
    wait(ui, lambda d: d.find_elements(By.CSS_SELECTOR, "#chart svg polyline"), what="a chart")

    result = next(d for d in ui.find_elements(By.CSS_SELECTOR, "#results details")
                  if d.find_element(By.TAG_NAME, "summary").text == site.page_url(3))
    result.find_element(By.TAG_NAME, "summary").click()
    opened = result.find_element(By.TAG_NAME, "pre")
    wait(ui, lambda d: opened.is_displayed(), what="the result opened")
    assert '"heading": "Page 3"' in opened.text and '"number": 3' in opened.text
    shoot(ui, shots, "job-finished")
    assert low_contrast(ui) == []

    ui.get(api.url + "/")
    row = wait(ui, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-job="shop"]'))[0]
    assert "finished" in row.text and "11 / 11 (100 %)" in row.text
    shoot(ui, shots, "jobs")
    assert low_contrast(ui) == []

    ui.get(api.url + "/workers")
    wait(ui, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-worker]"), what="a worker")
    assert "running" in ui.find_element(By.CSS_SELECTOR, "[data-worker]").text
    wait(ui, lambda d: d.find_elements(By.CSS_SELECTOR, "#queues tbody tr"), what="queues")
    shoot(ui, shots, "workers")


def test_a_slow_jobs_dead_letter_is_replayed_and_the_job_cancelled_from_its_page(
        ui, api, site, fleet, shots):
    registry = JobRegistry(api.client)
    # Two pages at a time (the worker's concurrency), each answered after two seconds.
    urls = [site.url("/status/404")] + [site.url(f"/slow/2.{n:02d}") for n in range(SLOW_PAGES)]
    answer = api.call("POST", "/api/jobs", json={"name": "slow", "seeds": {"urls": urls}})
    assert answer.status_code == 201, answer.text
    log_in_with_the_keyboard(ui, api.url + "/jobs/slow")
    wait(ui, lambda d: "/status/404" in text_of(d, "dead"), 40, "the 404's dead letter")
    assert text_of(ui, "job-state") == "running"
    ui.find_element(By.ID, "replay").click()
    wait(ui, lambda d: "Replayed 1 dead letters." in text_of(d, "notice"), what="replayed")
    # Out of the dead-letter queue, back in the run's queue (behind its slow pages).
    wait(ui, lambda d: d.find_element(By.ID, "dead-none").is_displayed(), 10, "none left")
    assert not ui.find_element(By.ID, "replay").is_displayed()  # nothing to replay
    assert api.call("GET", "/api/dead-letters", params={"job": "slow"}).json()["letters"] == []
    wait(ui, lambda d: int(text_of(d, "f-results").replace(",", "")) > 0, what="some results")
    shoot(ui, shots, "job-running")

    ui.get(api.url + "/")  # the list's bar and pages/s, live
    row = 'tr[data-job="slow"]'
    wait(ui, lambda d: d.find_element(By.CSS_SELECTOR, f"{row} .rate").text not in ("", "–"),
         what="a pages/s figure in the list")
    assert "running" in ui.find_element(By.CSS_SELECTOR, row).text
    shoot(ui, shots, "jobs-running")

    ui.get(api.url + "/workers")  # the worker's pages in flight, live
    wait(ui, lambda d: "/slow/2." in d.find_element(By.CSS_SELECTOR, "[data-worker]").text,
         what="a slow page among the worker's current URLs")
    shoot(ui, shots, "workers-busy")
    assert low_contrast(ui) == []
    ui.get(api.url + "/jobs/slow")
    wait(ui, lambda d: text_of(d, "job-state") == "running", what="the job's page again")

    ui.find_element(By.ID, "cancel").send_keys(Keys.ENTER)  # focused and pressed: the keyboard
    wait(ui, lambda d: text_of(d, "job-state") == "cancelled", 20, "cancelled")
    assert registry.state("slow").state == "cancelled"
    assert ui.find_element(By.ID, "cancel").get_attribute("disabled") is not None
    counters = registry.counters(JobRef("slow", 1))
    assert counters.get("results", 0) < SLOW_PAGES / 2, counters  # stopped well before the end
    shoot(ui, shots, "job-cancelled")


def test_a_wrong_password_is_refused_and_a_read_only_user_gets_no_new_job_link(ui, api, shots):
    Tokens(api.client).add_user("viewer", PASSWORD, "read")
    ui.get(api.url + "/login")
    fill(ui, "user", "viewer")
    fill(ui, "password", PASSWORD + "x")
    ui.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait(ui, lambda d: d.find_element(By.ID, "login-error").is_displayed(), what="refused")
    assert "Wrong user name or password" in text_of(ui, "login-error")
    shoot(ui, shots, "login-refused")
    fill(ui, "password", PASSWORD)
    ui.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait(ui, lambda d: d.current_url == api.url + "/", what="the jobs page")
    assert not ui.find_elements(By.LINK_TEXT, "New job")
    ui.find_element(By.ID, "logout").click()
    wait(ui, lambda d: "/login" in d.current_url, what="logged out")
    ui.get(api.url + "/")
    wait(ui, lambda d: "/login" in d.current_url, what="the cookie is gone")
    ui.find_element(By.CSS_SELECTOR, "#token-login summary").click()  # a token instead
    fill(ui, "token", api.read)
    ui.find_element(By.CSS_SELECTOR, "#login-form button[type=submit]").click()
    wait(ui, lambda d: d.current_url == api.url + "/", what="logged in with a token")
    assert not ui.find_elements(By.LINK_TEXT, "New job")


def test_a_mistake_in_the_rules_or_the_depth_is_shown_next_to_that_field(ui, api, shots):
    log_in_with_the_keyboard(ui, api.url + "/jobs/new")
    fill(ui, "name", "typo")
    fill(ui, "seeds", "http://127.0.0.1:9/")
    fill(ui, "rules", "- name: a\n  fields: {title: h1\n")
    ui.find_element(By.CSS_SELECTOR, "#job-form button[type=submit]").click()
    wait(ui, lambda d: d.find_element(By.ID, "rules-error").is_displayed(), what="rules error")
    assert "line 3" in text_of(ui, "rules-error")
    assert ui.switch_to.active_element.get_attribute("id") == "rules"
    assert not ui.find_element(By.ID, "name-error").is_displayed()

    fill(ui, "rules", "")
    fill(ui, "depth", "-1")
    ui.find_element(By.CSS_SELECTOR, "#job-form button[type=submit]").click()
    wait(ui, lambda d: d.find_element(By.ID, "depth-error").is_displayed(), what="depth error")
    assert "crawl.max_depth" in text_of(ui, "depth-error")
    assert not ui.find_element(By.ID, "rules-error").is_displayed()
    assert ui.current_url == api.url + "/jobs/new"  # nothing submitted
    assert api.call("GET", "/api/jobs").json() == []
