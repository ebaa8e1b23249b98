"""``rsigym watch`` in a real browser: headless Chromium driven by Selenium through ``/usr/bin/chromedriver``.

The pages are checked as a person sees them: the browser signs in the way a user does (it opens the
URL ``rsigym watch`` prints, ``/?token=...``, once; the dashboard sets its cookie and drops the token
from the address bar; without it every page is a 401), the runs list sorts and filters, a finished
local-world run's page draws its charts (plotly SVG traces present), a sweep's page draws its
heatmap and anytime curves, and a live run's page gains steps while the test watches, then shows
the run as stalled and finished, all without reloading. The browser's console must stay free of
errors. Screenshots go to pytest's temporary directory (and to ``$RSIGYM_WATCH_SCREENSHOTS`` if set).

Needs Debian's ``chromium`` and ``chromium-driver`` (``make setup`` installs them as root); the
tests skip, saying so, where they are missing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import gymnasium as gym
import pytest

import rsigym_env  # noqa: F401
from rsigym_env.baselines import make_researcher
from rsigym_env.episode import run_episode
from rsigym_env.gateway.host import StepLog
from rsigym_env.report import write_report
from rsigym_env.serving.asgi import ThreadedASGIServer
from rsigym_env.sweep import make_grid, sweep
from rsigym_env.watch.app import create_app
from rsigym_env.watch.record import RunRecorder

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1000"]
STALL_S = 3.0
TINY = "rsigym-watch-test-tiny"
TOKEN = "rsw_browser-test-dashboard-token-8e2f"

selenium = pytest.importorskip("selenium", reason="selenium is not installed (pip install selenium: the dev extra)")
pytestmark = pytest.mark.skipif(
    not (os.access(CHROMIUM, os.X_OK) and os.access(CHROMEDRIVER, os.X_OK)),
    reason=f"headless Chromium not found ({CHROMIUM}, {CHROMEDRIVER}): apt-get install chromium chromium-driver "
           "(make setup does it when run as root)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402


def make_env(run_dir: Path, **kwargs: Any) -> gym.Env:
    """A joint-track env keeping its ledger and artifacts in ``run_dir``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    return gym.make("RSIGym/Joint-v0", ledger_path=run_dir / "ledger.sqlite", run_dir=run_dir, **kwargs)


def recorded(run_dir: Path, env: gym.Env, agent: str, pause: Callable[[int], None] | None = None) -> Any:
    """A scripted/random episode through ``StepLog(RunRecorder(env))``; ``pause(step)`` after each step."""
    wrapped = StepLog(RunRecorder(env, run_dir, researcher=agent, surface="test"), run_dir / "steps.jsonl")
    try:
        return run_episode(wrapped, make_researcher(agent), seed=0,
                           on_step=(lambda n, a, o, i: pause(n)) if pause else None)
    finally:
        wrapped.close()


class _Reused(Exception):
    pass


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A watched folder with a finished local-world run, sim runs and a sweep, served on loopback."""
    from rsigym_env.worlds.local.lm import tinker_client
    from rsigym_env.worlds.local.lm.model import ModelConfig

    root = tmp_path_factory.mktemp("site")
    local = root / "runs" / "local-aime"
    reuse = os.environ.get("RSIGYM_WATCH_LOCAL_RUN")  # a local-world run recorded earlier (quicker reruns)
    if reuse:
        shutil.copytree(reuse, local, ignore=shutil.ignore_patterns("sandbox", "tinker"))
    home = os.environ.get("RSIGYM_HOME")
    os.environ["RSIGYM_HOME"] = str(root / "home")
    try:
        if reuse:
            raise _Reused
        tinker_client.register_base_model(TINY, tinker_client.make_random_base(
            root / "base", ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=512)))
        recorded(local, make_env(local, world="local", benchmark="aime", world_options={"base_model": TINY}), "scripted")
    except _Reused:
        pass
    finally:
        if home is None:
            os.environ.pop("RSIGYM_HOME", None)
        else:
            os.environ["RSIGYM_HOME"] = home
    for bench, agent in (("gpqa-diamond", "scripted"), ("aime", "random")):
        run_dir = root / "runs" / f"sim-{bench}-{agent}"
        recorded(run_dir, make_env(run_dir, benchmark=bench), agent)
    result = sweep(make_grid(["random", "scripted"], ["aime", "terminal-bench-2", "skillsbench"], 2), local=True)
    result.save(root / "sweep-small" / "results.json")
    write_report(result.to_dict(), root / "sweep-small")
    with ThreadedASGIServer(create_app([root], stall_after_s=STALL_S, poll_s=0.2, admin_token=TOKEN),
                            name="watch-browser", graceful_s=0.5) as server:
        yield {"root": root, "url": server.url}


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folders = [tmp_path_factory.mktemp("screenshots")]
    if os.environ.get("RSIGYM_WATCH_SCREENSHOTS"):
        folders.append(Path(os.environ["RSIGYM_WATCH_SCREENSHOTS"]))
        folders[-1].mkdir(parents=True, exist_ok=True)
    return folders


@pytest.fixture(scope="module")
def browser(site: dict[str, Any]) -> Iterator[Any]:
    """Headless Chromium, signed in to the dashboard as a user is: the token URL opened once."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    profile = tempfile.mkdtemp(prefix="rsigym-chromium-")
    options.add_argument(f"--user-data-dir={profile}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    try:
        sign_in(driver, site["url"])
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def sign_in(driver: Any, url: str) -> None:
    """Open the URL ``rsigym watch`` prints (``/?token=...``): the dashboard sets its cookie and redirects."""
    driver.get(f"{url}/?token={TOKEN}")
    assert driver.current_url == f"{url}/", driver.current_url  # the token is gone from the address bar


def wait(driver: Any, condition: Callable[[Any], Any], timeout_s: float = 15.0, what: str = "") -> Any:
    return WebDriverWait(driver, timeout_s, poll_frequency=0.1).until(condition, message=what)


def no_console_errors(driver: Any) -> None:
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, f"console errors: {errors}"


def screenshot(driver: Any, folders: list[Path], name: str) -> None:
    """A full-page screenshot (the window grown to the page's height, then back)."""
    size = driver.get_window_size()
    height = min(int(driver.execute_script("return document.documentElement.scrollHeight")) + 20, 5000)
    driver.set_window_size(size["width"], height)
    time.sleep(0.4)  # plotly redraws on resize
    for folder in folders:
        assert driver.save_screenshot(str(folder / name))
        assert (folder / name).stat().st_size > 10_000
    driver.set_window_size(size["width"], size["height"])


def charts_drawn(driver: Any, ids: list[str]) -> bool:
    return all(driver.execute_script(
        "const d = document.getElementById(arguments[0]);"
        "return !!d && d.querySelectorAll('svg.main-svg').length > 0 &&"
        " d.querySelectorAll('.scatterlayer .trace, .barlayer .trace, .heatmaplayer .hm').length > 0;", i) for i in ids)


def rows(driver: Any) -> list[Any]:
    return [r for r in driver.find_elements(By.CSS_SELECTOR, "#runs tbody tr") if r.is_displayed()]


def test_without_its_token_the_dashboard_shows_nothing_and_the_token_url_signs_in(site: dict[str, Any], browser: Any):
    browser.delete_all_cookies()
    try:
        browser.get(site["url"] + "/runs/sim-aime-random")
        body = browser.find_element(By.TAG_NAME, "body").text
        assert "401" in body and "token" in body and "sim-aime-random" not in body and str(site["root"]) not in body
        browser.get_log("browser")  # the 401 itself is logged as a failed load: not an error of the pages
        browser.get(site["url"] + f"/runs/sim-aime-random?token={TOKEN}")
        assert browser.current_url == site["url"] + "/runs/sim-aime-random"
        wait(browser, lambda d: text_of(d, "run-status") == "finished", what="the run's page, signed in")
        assert "rsigym-watch" not in browser.execute_script("return document.cookie")  # HttpOnly: no script reads it
        wait(browser, lambda d: "live" in d.find_element(By.ID, "live").get_attribute("class"),
             what="the live stream (EventSource), authorized by the cookie")
        no_console_errors(browser)
    finally:
        sign_in(browser, site["url"])


def test_the_runs_list_sorts_and_filters(site: dict[str, Any], browser: Any, shots: list[Path]):
    browser.get(site["url"] + "/")
    wait(browser, lambda d: "live" in d.find_element(By.ID, "live").get_attribute("class"), what="the live stream")
    assert {r.get_attribute("data-key") for r in rows(browser)} == {"local-aime", "sim-gpqa-diamond-scripted",
                                                                     "sim-aime-random"}
    assert all(r.get_attribute("data-status") == "finished" for r in rows(browser))
    gain = browser.find_element(By.CSS_SELECTOR, 'th[data-sort="10"]')
    gain.click()
    values = [float(r.find_elements(By.TAG_NAME, "td")[10].get_attribute("data-v")) for r in rows(browser)]
    assert values == sorted(values)
    gain.click()
    values = [float(r.find_elements(By.TAG_NAME, "td")[10].get_attribute("data-v")) for r in rows(browser)]
    assert values == sorted(values, reverse=True)
    Select(browser.find_element(By.NAME, "researcher")).select_by_visible_text("random")
    assert [r.get_attribute("data-key") for r in rows(browser)] == ["sim-aime-random"]
    assert browser.find_element(By.ID, "count").text == "1 of 3 runs"
    Select(browser.find_element(By.NAME, "researcher")).select_by_visible_text("all")
    Select(browser.find_element(By.NAME, "status")).select_by_visible_text("running")
    assert rows(browser) == []
    Select(browser.find_element(By.NAME, "status")).select_by_visible_text("all")
    browser.find_element(By.NAME, "q").send_keys("local")
    assert [r.get_attribute("data-key") for r in rows(browser)] == ["local-aime"]
    browser.find_element(By.NAME, "q").clear()
    browser.execute_script("document.querySelector('#filters [name=q]').dispatchEvent(new Event('input'))")
    assert len(rows(browser)) == 3
    assert "sweep-small" in browser.find_element(By.ID, "sweeps").text
    no_console_errors(browser)
    screenshot(browser, shots, "watch-runs.png")


def test_a_finished_local_world_run_draws_its_charts(site: dict[str, Any], browser: Any, shots: list[Path]):
    browser.get(site["url"] + "/runs/local-aime")
    charts = ["chart-budget-steps", "chart-budget-time", "chart-dev", "chart-loss", "chart-failures"]
    wait(browser, lambda d: charts_drawn(d, charts), 20, "every chart drawn")
    assert browser.find_element(By.ID, "run-status").text == "finished"
    assert "chain intact" in browser.find_element(By.ID, "audit").text
    assert "local" in browser.find_element(By.ID, "sec-header").text
    result = browser.find_element(By.ID, "sec-result").text.lower()
    assert "submitted system" in result and "official score" in result
    # a step's full observation, on demand
    browser.find_element(By.CSS_SELECTOR, 'button.obs[data-step="1"]').click()
    pre = browser.find_element(By.CSS_SELECTOR, 'tr.obs-row[data-for="1"] pre')
    wait(browser, lambda d: pre.text and pre.text != "loading…", what="the observation text")
    assert pre.text.startswith("[step 1/") and "evaluate started as job-1" in pre.text
    # per-task results of an evaluation, and a harness diff
    details = browser.find_element(By.CSS_SELECTOR, "#sec-jobs details")
    details.find_element(By.TAG_NAME, "summary").click()
    assert len(details.find_elements(By.CSS_SELECTOR, "table.tasks tbody tr")) >= 5
    diff = browser.find_element(By.CSS_SELECTOR, "#sec-harness tr:not(:first-child) details")
    diff.find_element(By.TAG_NAME, "summary").click()
    assert diff.find_elements(By.CSS_SELECTOR, ".dadd") and diff.find_elements(By.CSS_SELECTOR, ".ddel")
    no_console_errors(browser)
    screenshot(browser, shots, "watch-run.png")


def test_a_sweep_page_draws_its_table_heatmap_and_curves(site: dict[str, Any], browser: Any, shots: list[Path]):
    browser.get(site["url"] + "/sweeps/sweep-small")
    wait(browser, lambda d: charts_drawn(d, ["chart-heatmap", "chart-anytime-0", "chart-anytime-1", "chart-anytime-2"]),
         20, "heatmap and anytime curves")
    traces = browser.execute_script(
        "return document.querySelectorAll('#chart-anytime-0 .scatterlayer .trace').length")
    assert traces == 2  # one line per agent
    table = browser.find_element(By.ID, "figure2")
    assert table.find_elements(By.CSS_SELECTOR, "td.best") and "★" in table.text
    links = browser.find_elements(By.CSS_SELECTOR, "#episodes tbody a")
    assert len(links) == 12
    no_console_errors(browser)
    screenshot(browser, shots, "watch-sweep.png")
    links[5].click()
    wait(browser, lambda d: charts_drawn(d, ["chart-episode"]), 15, "the episode's anytime curve")
    assert "episode 5 of sweep" in browser.find_element(By.TAG_NAME, "h1").text
    no_console_errors(browser)


def text_of(driver: Any, element_id: str) -> str | None:
    """An element's text read in the page (no stale references while live updates replace it)."""
    return driver.execute_script("const e = document.getElementById(arguments[0]);"
                                 "return e ? e.textContent.trim() : null;", element_id)


def step_numbers(driver: Any) -> list[int]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll('#steps-body tr.step')).map(r => +r.dataset.step);")


def test_a_live_run_gains_steps_while_watched_then_stalls_and_finishes(site: dict[str, Any], browser: Any):
    run_dir = site["root"] / "runs" / "live-run"
    started, watching, release, done = threading.Event(), threading.Event(), threading.Event(), threading.Event()

    def pause(step: int) -> None:
        if step == 2:
            started.set()
            watching.wait(60)  # go on once the page is open
        if step == 7:
            release.wait(60)  # the researcher "thinks" here: no step for a while
        time.sleep(0.3 if step < 7 else 0.02)

    env = make_env(run_dir, benchmark="aime")
    thread = threading.Thread(target=lambda: (recorded(run_dir, env, "scripted", pause), done.set()), daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        browser.get(site["url"] + "/runs/live-run")
        browser.execute_script("window.__notReloaded = 42")
        assert step_numbers(browser) == [1, 2] and text_of(browser, "run-status") == "running"
        watching.set()
        wait(browser, lambda d: len(step_numbers(d)) >= 7, 30, "steps arriving while the page is open")
        assert step_numbers(browser) == list(range(1, len(step_numbers(browser)) + 1))
        wait(browser, lambda d: text_of(d, "run-status") == "stalled", STALL_S + 15, "the run shown as stalled")
        assert "no step for" in text_of(browser, "sec-header")
        release.set()
        wait(browser, lambda d: text_of(d, "run-status") == "finished", 30, "the run finished")
        assert done.wait(30)
        assert browser.execute_script("return window.__notReloaded") == 42
        total = len(step_numbers(browser))
        assert total == int(browser.find_element(By.ID, "run").get_attribute("data-after")) > 7
        assert charts_drawn(browser, ["chart-budget-steps", "chart-dev"])
        assert "submitted system" in text_of(browser, "sec-result").lower()
        no_console_errors(browser)
        browser.get(site["url"] + "/")  # and the list has it, finished
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, 'tr[data-key="live-run"][data-status="finished"]'), 15,
             "the live run in the list")
        no_console_errors(browser)
    finally:
        watching.set()
        release.set()
        thread.join(60)
