"""The playground notebook in a real browser: JupyterLab on loopback, Debian's Chromium driven
by Playwright (recipe: shared/notes/browser-testing.md). Run with `pytest -m browser`.

A fresh server per test, on a copy of the notebook in a temp folder (the kernel outlives the
page, and autosave would write outputs into the notebook under test), in smoke mode."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = REPO / "notebooks" / "10_playground.ipynb"
SCREENSHOT = REPO / "out" / "browser" / "playground.png"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
RUN_TIMEOUT_MS = 240_000  # one smoke run is ~5-20 s on a busy 2-core machine

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM),
                       reason=f"Debian's Chromium is not installed at {CHROMIUM}: "
                              "apt-get install -y chromium (never `playwright install`)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, argv) of the direct children of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue  # the process ended meanwhile
        if ppid == pid:
            found.append((int(entry.name), argv))
    return found


def _with_details() -> Path:
    """The course notebook with the most folded <details> blocks (issue 50: provenance and
    answers are folded)."""
    def count(path: Path) -> int:
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return sum("".join(c["source"]).count("<details>") for c in cells
                   if c["cell_type"] == "markdown")
    return max(sorted((REPO / "notebooks").glob("*.ipynb")), key=count)


@pytest.fixture
def lab(tmp_path, request):
    """A JupyterLab server on a fresh folder holding a copy of the notebook (the playground, or
    the test's `notebook` parameter); stopped after."""
    notebook = getattr(request, "param", None) or NOTEBOOK
    python = str(VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable))
    root, home = tmp_path / "root", tmp_path / "jupyter"
    root.mkdir()
    shutil.copy(notebook, root / notebook.name)
    settings = home / "app-settings"  # fresh app settings: overrides.json turns off the news
    settings.mkdir(parents=True)
    (settings / "overrides.json").write_text(json.dumps({
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                        "checkForUpdates": False},
        # every cell in the page, so the test sees each one (JupyterLab renders by viewport)
        "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"}}))
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, FASTDIFF_SMOKE="1", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               JUPYTER_CONFIG_DIR=str(home / "config"), JUPYTER_DATA_DIR=str(home / "data"),
               JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    env.pop("TQDM_DISABLE", None)
    log = open(tmp_path / "jupyter.log", "wb")
    server = subprocess.Popen(
        [python, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip", "127.0.0.1",
         "--port", str(port), f"--IdentityProvider.token={token}",
         f"--ServerApp.root_dir={root}", "--LabApp.news_url=None",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.app_settings_dir={settings}"],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    base = f"http://127.0.0.1:{port}"
    kernels: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).read()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("JupyterLab did not start:\n"
                                       + (tmp_path / "jupyter.log").read_text()[-3000:])
                time.sleep(0.3)
        yield dict(base=base, token=token, server=server, python=python, kernels=kernels,
                   log=tmp_path / "jupyter.log")
    finally:
        kernels += [pid for pid, argv in _children(server.pid) if "ipykernel_launcher" in argv]
        if server.poll() is None:
            try:  # a clean shutdown also stops the kernels it started
                urllib.request.urlopen(urllib.request.Request(
                    f"{base}/api/shutdown?token={token}", method="POST"), timeout=10)
                server.wait(timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                server.terminate()
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.kill()
                    server.wait()
        for pid in kernels:  # only the kernels this server started, by their id
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        log.close()


def _chart_src(page) -> str | None:
    return page.evaluate("""() => {
        const img = document.querySelector('.widget-output .jp-RenderedImage img');
        return img && img.naturalWidth > 0 ? img.src : null; }""")


def test_playground_runs_twice_in_jupyterlab(lab, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=120_000)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    with sync_playwright() as p:
        browser = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1500, "height": 1400})
        try:
            page = browser.pages[0] if browser.pages else browser.new_page()
            page.set_default_timeout(120_000)
            page.goto(f"{lab['base']}/lab/tree/{NOTEBOOK.name}?reset&token={lab['token']}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook")
            expect(page.get_by_role("contentinfo").get_by_role(
                "button", name=re.compile(r"\| Idle$"))).to_be_visible()
            timings["open"] = time.monotonic() - t0

            page.evaluate("async () => await window.jupyterapp.commands.execute("
                          "'notebook:run-all-cells')")
            panel = page.locator(".fastdiff-playground")
            run = panel.get_by_role("button", name="Run", exact=True)
            expect(run).to_be_visible()
            kernels = [argv for _, argv in _children(lab["server"].pid)
                       if "ipykernel_launcher" in argv]
            venv_bin = os.path.realpath(Path(lab["python"]).parent)
            assert kernels and os.path.realpath(Path(kernels[0][0]).parent) == venv_bin, \
                f"the kernel is not the venv's python: {kernels}"
            timings["run all cells"] = time.monotonic() - t0

            run.click()  # the baseline
            page.wait_for_function("""() => {
                const img = document.querySelector('.widget-output .jp-RenderedImage img');
                return img && img.naturalWidth > 0; }""", timeout=RUN_TIMEOUT_MS)
            rows = panel.locator("table.fastdiff-results tbody tr")
            expect(rows).to_have_count(1)
            expect(rows.first).to_contain_text("baseline")
            first_chart = _chart_src(page)
            timings["baseline run"] = time.monotonic() - t0

            panel.get_by_role("combobox", name="dtype").select_option("bf16")
            expect(panel.locator("textarea")).to_have_value(
                re.compile(r"pipe\.to\(torch\.bfloat16\)"))
            run.click()
            expect(rows).to_have_count(2, timeout=RUN_TIMEOUT_MS)
            page.wait_for_function("""(old) => {
                const img = document.querySelector('.widget-output .jp-RenderedImage img');
                return img && img.naturalWidth > 0 && img.src !== old; }""",
                                   arg=first_chart, timeout=RUN_TIMEOUT_MS)
            expect(rows.nth(1)).to_contain_text("bf16")
            expect(rows.nth(1)).to_contain_text("dB")
            assert "Run failed" not in panel.inner_text()
            timings["bf16 run"] = time.monotonic() - t0

            expect(run).to_be_enabled()  # the run has finished, clean-up included
            SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
            panel.scroll_into_view_if_needed()
            panel.screenshot(path=str(SCREENSHOT))
        finally:
            browser.close()
    print("browser test timings (s, cumulative):",
          ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    assert SCREENSHOT.stat().st_size > 10_000


DETAILS_NOTEBOOK = _with_details()


@pytest.mark.parametrize("lab", [DETAILS_NOTEBOOK], indirect=True, ids=[DETAILS_NOTEBOOK.name])
def test_folded_blocks_render_folded_in_jupyterlab(lab, tmp_path):
    """Provenance, caveats and exercise answers sit in <details> blocks: JupyterLab's markdown
    renderer keeps them (its sanitizer allows details and summary) and shows them folded, the
    title visible and the body hidden until clicked. No kernel runs: markdown renders as the
    notebook opens."""
    from playwright.sync_api import expect, sync_playwright

    source = [("".join(c["source"])) for c in json.loads(
        DETAILS_NOTEBOOK.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "markdown"]
    expected = sum(cell.count("<details>") for cell in source)
    assert expected >= 3, f"{DETAILS_NOTEBOOK.name} has {expected} folded blocks"
    shot = REPO / "out" / "browser" / "details.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                    args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1600})
            page.set_default_timeout(60_000)
            page.goto(f"{lab['base']}/lab/tree/{DETAILS_NOTEBOOK.name}?reset&token={lab['token']}")
            page.wait_for_selector(".jp-NotebookPanel .jp-Notebook .jp-RenderedMarkdown")
            blocks = page.locator(".jp-RenderedMarkdown details")
            expect(blocks).to_have_count(expected)
            assert page.locator(".jp-RenderedMarkdown details[open]").count() == 0
            first = blocks.first
            first.scroll_into_view_if_needed()
            summary = first.locator("summary")
            expect(summary).to_be_visible()
            body = first.locator(":scope > :not(summary)").first
            expect(body).to_be_hidden()
            shot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(shot).replace(".png", "-folded.png"))
            summary.click()
            expect(body).to_be_visible()
            first.screenshot(path=str(shot))
        finally:
            browser.close()
    assert shot.stat().st_size > 2_000


def test_make_lab_starts_as_this_user_and_serves_the_course(tmp_path):
    """`make lab` as the user running the tests (root on CI: JupyterLab refuses root without
    --allow-root, which the Makefile adds): the printed URL opens the course in Chromium."""
    from playwright.sync_api import sync_playwright

    port, home = _free_port(), tmp_path / "jupyter"
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(home / "config"),
               JUPYTER_DATA_DIR=str(home / "data"), JUPYTER_RUNTIME_DIR=str(home / "runtime"),
               JUPYTERLAB_WORKSPACES_DIR=str(home / "workspaces"))
    log_path = tmp_path / "make-lab.log"
    with open(log_path, "wb") as log:
        make = subprocess.Popen(["make", "lab", f"LAB_PORT={port}"], cwd=REPO, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None:
            found = re.search(rf"http://127\.0\.0\.1:{port}/lab\?token=\w+", log_path.read_text())
            url = found.group(0) if found else None
            if url is None and (make.poll() is not None or time.monotonic() > deadline):
                raise AssertionError("make lab did not print its URL:\n" + log_path.read_text())
            time.sleep(0.5)
        assert "Running as root is not recommended" not in log_path.read_text() or \
            os.getuid() == 0
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_FLAGS)
            try:
                page = browser.new_page()
                page.goto(url)
                listing = page.locator(".jp-DirListing-content")
                listing.get_by_text("00_setup.ipynb").wait_for(timeout=60_000)
                assert listing.get_by_text("05_cold_start.ipynb").count() == 1
                # no "Jupyter news?" pop-up over the page (it came a moment after restore)
                page.wait_for_timeout(3000)
                assert page.get_by_text("official Jupyter news").count() == 0
            finally:
                browser.close()
    finally:
        os.killpg(make.pid, signal.SIGTERM)
        try:
            make.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
