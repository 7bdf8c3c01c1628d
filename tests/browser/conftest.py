"""Browser-test harness: JupyterLab on 127.0.0.1, driven by Debian's chromium via playwright.

Fixtures (see README.md in this folder for a worked example):

- ``lab_server`` (session): a JupyterLab server from this venv on a free port with a token,
  isolated config/data/runtime/settings/workspace dirs, torn down at the end.
- ``notebook_server`` (session): the same for Jupyter Notebook 7 (the ``notebook`` package).
- ``browser_context`` (session): a headless chromium context with a fresh profile.
- ``page`` (function): a new tab in that context.
- ``console_log`` (function): that tab's console messages and page errors.
- ``lab`` (function): a :class:`LabPage`, the helper a test talks to: write a notebook,
  open it, run all, wait, query outputs, take screenshots.  On failure it saves a
  screenshot, the server log tail and the browser console under ``artifacts/browser/``.
- ``nb7`` (function): a :class:`LabPage` on the Notebook 7 server (the same helpers: both
  front ends are built from JupyterLab's components and expose ``window.jupyterapp``).

Everything skips (with the reason) when ``/usr/bin/chromium`` or the ``playwright``
package is missing; ``.ci/run`` installs chromium, so on CI these tests run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import BrowserContext, Locator, Page

CHROMIUM = "/usr/bin/chromium"
REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS_DIR = REPO_ROOT / "artifacts" / "browser"

# Without the background-networking/component-update/sync flags chromium keeps trying
# Google endpoints, and on this machine's closed network those connections are refused
# (noisy, and slow to give up).  --disable-dev-shm-usage: containers often give
# /dev/shm only 64 MiB, where chromium crashes rendering large pages; Debian's wrapper
# adds it only when it manages to measure /dev/shm.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",  # we run as root, where chromium's sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]

SERVER_START_TIMEOUT_S = 60.0
# Kernel start plus the first widget-manager handshake can take a while on a loaded
# 2-core CI box; the timeouts are generous, and every wait fails with a diagnosis.
OPEN_TIMEOUT_S = 90.0
RUN_TIMEOUT_S = 120.0

# Settings written into the isolated JUPYTERLAB_SETTINGS_DIR.  fetchNews "false":
# otherwise JupyterLab asks "Would you like to get notified about official Jupyter
# news?" in a toast that covers part of the notebook.  windowingMode "none": JupyterLab
# 4 detaches cells outside the viewport by default, so a query for a cell further down
# would find nothing; tests want every cell in the DOM.
LAB_SETTINGS: dict[str, dict[str, Any]] = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {
        "windowingMode": "none",
    },
}

# Installed in every page before JupyterLab loads.  It reaches the app through
# window.jupyterapp (exposed by --LabApp.expose_app_in_browser=True), which is steadier
# than scraping the UI: the toolbar's execution indicator says "idle" before the kernel
# has even connected, and menus move between releases.
HELPERS_JS = r"""
window.__labtest = {
  runs: {},
  app() { return window.jupyterapp || null; },
  panel(path) {
    const app = this.app();
    if (!app) { return null; }
    for (const w of app.shell.widgets('main')) {
      if (w.context && w.context.path === path && w.sessionContext && w.content) { return w; }
    }
    return null;
  },
  state(path) {
    const p = this.panel(path);
    if (!p) { return { found: false, app: !!this.app() }; }
    const s = p.sessionContext;
    const k = s.session ? s.session.kernel : null;
    return {
      found: true,
      app: true,
      id: p.id,
      contextReady: p.context.isReady,
      sessionReady: s.isReady,
      kernel: k ? k.status : null,
      connection: k ? k.connectionStatus : null,
      cells: p.content.widgets.length,
    };
  },
  runAll(path) {
    const app = this.app();
    const p = this.panel(path);
    if (!p) { throw new Error('notebook ' + path + ' is not open'); }
    app.shell.activateById(p.id);
    const run = { done: false, ok: null, error: null, started: Date.now() };
    this.runs[path] = run;
    // notebook:run-all-cells resolves when the last cell finishes, to false when a
    // cell raised (NotebookActions.runAll); not awaited here so the test can watch
    // the page while cells run.
    app.commands.execute('notebook:run-all-cells', { widgetId: p.id }).then(
      (ok) => { run.done = true; run.ok = ok !== false; },
      (err) => { run.done = true; run.ok = false; run.error = String(err); },
    );
  },
  run(path) { return this.runs[path] || null; },
  trusted(path) {
    const p = this.panel(path);
    if (!p || !p.content.model) { return null; }
    const cells = p.content.model.cells;
    const out = [];
    for (let i = 0; i < cells.length; i++) { out.push(!!cells.get(i).trusted); }
    return out;
  },
};
"""


class LabError(AssertionError):
    """A harness wait or check failed; the message carries the diagnosis."""


def _free_port() -> int:
    # Racy in principle (the port could be taken before the server binds it), so the
    # server may retry ports; the real one is read back from its runtime file.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "test"


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class LabServer:
    """A running JupyterLab (or Notebook 7) server: where it is, how to authenticate, where
    it logs."""

    base_url: str  # "http://127.0.0.1:PORT/"
    token: str
    root_dir: Path  # the directory it serves; notebooks go here
    log_path: Path
    process: subprocess.Popen[bytes]
    frontend: str = "lab"  # "lab" (JupyterLab) or "notebook" (Notebook 7)

    def notebook_path(self, name: str) -> str:
        """The page that opens notebook ``name`` (relative to the root): JupyterLab in a
        fresh workspace (no tabs restored from an earlier test), or Notebook 7's page."""
        if self.frontend == "notebook":
            return f"notebooks/{name}"
        return f"lab/workspaces/t{uuid.uuid4().hex[:12]}/tree/{name}"

    def url(self, path: str) -> str:
        """The URL of ``path`` (relative to the server root) with the token attached."""
        sep = "&" if "?" in path else "?"
        return f"{self.base_url}{path.lstrip('/')}{sep}token={self.token}"

    def api(self, method: str, path: str, timeout: float = 10.0) -> Any:
        """Call the REST API (``path`` like ``"api/sessions"``); return the decoded JSON."""
        request = urllib.request.Request(
            self.base_url + path.lstrip("/"),
            method=method,
            headers={"Authorization": f"token {self.token}"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body else None

    def log_tail(self, lines: int = 60) -> str:
        return _tail(self.log_path, lines)

    def shutdown_sessions(self) -> None:
        """Shut down every notebook session (and its kernel), so tests do not share kernels.

        JupyterLab keeps a session per notebook path; without this, a later test that
        opens a notebook of the same name would attach to the earlier test's kernel.
        """
        try:
            for session in self.api("GET", "api/sessions"):
                self.api("DELETE", f"api/sessions/{session['id']}")
        except (OSError, urllib.error.URLError, ValueError):
            pass  # the server is going away anyway; teardown must not mask a test failure


# How each front end is started: its module and the switch that exposes window.jupyterapp.
FRONTENDS = {
    "lab": ("jupyterlab", "--LabApp.expose_app_in_browser=True"),
    "notebook": ("notebook", "--JupyterNotebookApp.expose_app_in_browser=True"),
}


def _start_lab_server(base: Path, frontend: str = "lab") -> LabServer:
    dirs = {
        name: base / name
        for name in ("root", "config", "data", "runtime", "settings", "workspaces", "ipython")
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    for rel, values in LAB_SETTINGS.items():
        target = dirs["settings"] / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))

    token = uuid.uuid4().hex
    # The per-user dirs are replaced by tmp dirs so the user's ~/.jupyter, ~/.ipython
    # and saved workspaces cannot change what the tests see.  The venv's own
    # share/jupyter (sys.prefix) stays on the data path whatever JUPYTER_DATA_DIR says,
    # which is where the ipywidgets lab extension (jupyterlab_widgets) and the python3
    # kernelspec live.  PYTHONPATH puts this checkout first, so kernels import the
    # working tree's gpumagic even when it is not pip-installed.
    env = dict(os.environ)
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]),
        JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]),
        JUPYTERLAB_SETTINGS_DIR=str(dirs["settings"]),
        JUPYTERLAB_WORKSPACES_DIR=str(dirs["workspaces"]),
        IPYTHONDIR=str(dirs["ipython"]),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
        PYTHONUNBUFFERED="1",
    )
    module, expose = FRONTENDS[frontend]
    cmd = [
        sys.executable,
        "-m",
        module,
        "--no-browser",
        "--allow-root",  # CI runs as root; harmless otherwise
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={_free_port()}",
        "--ServerApp.port_retries=20",
        f"--ServerApp.root_dir={dirs['root']}",
        f"--IdentityProvider.token={token}",
        expose,
        # No network here: no news feed, and the extension manager must not query PyPI.
        "--LabApp.news_url=None",
        "--LabApp.extension_manager=readonly",
    ]
    log_path = base / "server.log"
    with log_path.open("wb") as log:
        # start_new_session: the server gets its own process group, so teardown can
        # signal the server and anything it spawned without touching pytest.
        process = subprocess.Popen(
            cmd,
            env=env,
            cwd=dirs["root"],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    server = LabServer(
        base_url="",
        token=token,
        root_dir=dirs["root"],
        log_path=log_path,
        process=process,
        frontend=frontend,
    )
    runtime_file = dirs["runtime"] / f"jpserver-{process.pid}.json"
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise LabError(
                f"{module} exited with code {process.returncode} while starting.\n"
                f"command: {' '.join(cmd)}\nlog tail ({log_path}):\n{server.log_tail()}"
            )
        if not server.base_url and runtime_file.exists():
            try:
                info = json.loads(runtime_file.read_text())
                server.base_url = f"http://127.0.0.1:{info['port']}{info.get('base_url', '/')}"
            except (ValueError, KeyError):
                pass  # written but not complete yet
        if server.base_url:
            try:
                server.api("GET", "api/status", timeout=2.0)
                return server
            except (OSError, urllib.error.URLError):
                pass
        time.sleep(0.2)
    _stop_lab_server(server)
    raise LabError(
        f"{module} did not answer within {SERVER_START_TIMEOUT_S:.0f} s.\n"
        f"log tail ({log_path}):\n{server.log_tail()}"
    )


def _stop_lab_server(server: LabServer) -> None:
    process = server.process
    if process.poll() is not None:
        return
    # Kernels are started in sessions of their own (jupyter_client's launcher), so
    # signalling the server's group does not reach them: remember them first, let the
    # server shut them down on SIGTERM, and kill only those that survive.
    kernels: list[Any] = []
    try:
        import psutil

        kernels = psutil.Process(process.pid).children(recursive=True)
    except Exception:  # psutil missing or the server already gone: nothing to track
        kernels = []
    server.shutdown_sessions()
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break  # the whole group is gone already
        try:
            process.wait(timeout=grace)
            break
        except subprocess.TimeoutExpired:
            continue  # escalate to SIGKILL
    for child in kernels:
        try:
            if child.is_running():
                child.kill()
        except Exception:  # already gone between the check and the kill
            pass


def _require_browser() -> None:
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"{CHROMIUM} is missing: install Debian's chromium "
            "(`apt-get update && apt-get install -y chromium`; never `playwright install`)"
        )
    pytest.importorskip("playwright.sync_api", reason="the `playwright` package is not installed")


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """``artifacts/browser/`` under the repo root (gitignored), created on demand."""
    ARTIFACTS_DIR.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS_DIR


@pytest.fixture(scope="session")
def lab_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A JupyterLab server for the whole session (skips when no browser is available)."""
    _require_browser()
    server = _start_lab_server(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield server
    finally:
        _stop_lab_server(server)


@pytest.fixture(scope="session")
def notebook_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabServer]:
    """A Jupyter Notebook 7 server for the whole session (skips without a browser or without
    the ``notebook`` package, which the test extra installs)."""
    _require_browser()
    pytest.importorskip("notebook.app", reason="the `notebook` package (Notebook 7) is not installed")
    server = _start_lab_server(tmp_path_factory.mktemp("notebook7"), frontend="notebook")
    try:
        yield server
    finally:
        _stop_lab_server(server)


# Module scope: playwright's sync API keeps its event loop running (in a greenlet) while the
# context lives, and IPython answers a plain cell's top-level `await` with the running loop, so
# the in-process shell's await cells would fail in every test after the browser tests (tests/
# browser is no package, so pytest's package scope would be the session).
@pytest.fixture(scope="module")
def browser_context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrowserContext]:
    """A headless chromium context (playwright sync API) with a fresh, throwaway profile."""
    _require_browser()
    from playwright.sync_api import sync_playwright

    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_playwright() as pw:
        # launch_persistent_context, because playwright refuses --user-data-dir in args.
        context = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            yield context
        finally:
            context.close()


@dataclass
class ConsoleLog:
    """Browser console messages and page errors, kept for failure reports."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)
        del self.lines[:-200]  # a chatty page must not grow this without bound

    def tail(self, n: int = 40) -> str:
        return "\n".join(self.lines[-n:]) or "<empty>"


@pytest.fixture
def page(browser_context: BrowserContext) -> Iterator[Page]:
    """A new chromium tab (playwright sync ``Page``) with the harness's JS helpers installed."""
    tab = browser_context.new_page()
    tab.add_init_script(HELPERS_JS)
    try:
        yield tab
    finally:
        tab.close()


@pytest.fixture
def console_log(page: Page) -> ConsoleLog:
    """The tab's console messages and uncaught page errors, from now on."""
    log = ConsoleLog()
    page.on("console", lambda msg: log.add(f"[{msg.type}] {msg.text}"))
    page.on("pageerror", lambda err: log.add(f"[pageerror] {err}"))
    return log


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    # Keep each phase's report on the item so the ``lab`` fixture's teardown knows
    # whether the test failed (and should leave a screenshot behind).  Old-style
    # hookwrapper: pyproject allows pytest 7, which lacks ``wrapper=True``.
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


class LabPage:
    """What a browser test does with JupyterLab, with waits that explain their failures.

    Cells are addressed by their 0-based index in the notebook.
    """

    def __init__(
        self,
        page: Page,
        server: LabServer,
        artifacts: Path,
        test_name: str,
        console: ConsoleLog | None = None,
    ) -> None:
        self.page = page
        self.server = server
        self.console = console
        self.artifacts = artifacts
        self.test_name = _slug(test_name)
        self.path: str | None = None  # the notebook opened last, relative to the root
        self._panel_id: str | None = None
        self.screenshots: list[Path] = []
        self.failure_saved = False
        self.dialogs_seen: list[str] = []  # texts of dialogs and toasts closed so far

    # -- notebooks -----------------------------------------------------------------

    def write_notebook(self, name: str, cells: Sequence[str | Any]) -> Path:
        """Write ``name`` (``.ipynb`` added if missing) into the served dir and return its path.

        ``cells``: source strings (code cells) or nbformat cell nodes (for markdown).
        The python3 kernelspec is set so JupyterLab starts it without asking.
        """
        import nbformat

        if not name.endswith(".ipynb"):
            name += ".ipynb"
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {
            "name": "python3",
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
        }
        nb.metadata["language_info"] = {"name": "python"}
        nb.cells = [nbformat.v4.new_code_cell(c) if isinstance(c, str) else c for c in cells]
        target = self.server.root_dir / name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, target)
        return target

    def open_notebook(self, name: str, timeout: float = OPEN_TIMEOUT_S) -> Locator:
        """Open ``name`` in JupyterLab and wait until its kernel is idle; return the panel locator.

        A fresh workspace name per call means no tabs restored from an earlier test.
        """
        if not name.endswith(".ipynb"):
            name += ".ipynb"
        self.path = name
        self._panel_id = None
        self.page.goto(
            self.server.url(self.server.notebook_path(name)),
            wait_until="domcontentloaded",
            timeout=timeout * 1000,
        )
        # A separate first wait, so a page that never becomes JupyterLab (login form,
        # server error, app not exposed) fails with a message that says so.
        self._wait(
            lambda: (bool(self._state().get("app")), self.page.title()),
            min(timeout, 60.0),
            "JupyterLab to load (window.jupyterapp; needs --LabApp.expose_app_in_browser)",
        )
        self.wait_kernel_idle(timeout)
        self.dismiss_dialogs()
        self._panel_id = str(self._state_or_fail()["id"])
        return self.panel

    @property
    def panel(self) -> Locator:
        """Locator of the open notebook's panel (every cell query is scoped to it)."""
        if self._panel_id is None:
            self._panel_id = str(self._state_or_fail()["id"])
        return self.page.locator(f'[id="{self._panel_id}"]')

    def _state(self) -> dict[str, Any]:
        return dict(self.page.evaluate("p => window.__labtest.state(p)", self.path))

    def trusted(self) -> list[bool]:
        """Each cell's trust as the front end holds it (False for every cell of a notebook
        someone else saved: its HTML outputs are sanitised)."""
        flags = self.page.evaluate("p => window.__labtest.trusted(p)", self.path)
        if flags is None:
            self.fail(f"notebook {self.path!r} is not open")
        return [bool(f) for f in flags]

    def wait_kernel_idle(self, timeout: float = OPEN_TIMEOUT_S) -> None:
        """Wait until the notebook is loaded and its kernel is connected and idle."""

        def ready() -> tuple[bool, Any]:
            s = self._state()
            ok = (
                s.get("found")
                and s.get("contextReady")
                and s.get("sessionReady")
                and s.get("connection") == "connected"
                and s.get("kernel") == "idle"
            )
            return bool(ok), s

        self._wait(
            ready, timeout, f"kernel of {self.path} to be idle", on_tick=self.dismiss_dialogs
        )

    def dismiss_dialogs(self) -> list[str]:
        """Close modal dialogs and notification toasts; return the text of each one closed.

        Everything closed is also kept in ``self.dialogs_seen`` for failure reports.  A
        "Select Kernel" dialog is accepted (it preselects the notebook's kernelspec);
        other dialogs are dismissed; toasts are closed so they cannot cover outputs in
        screenshots.  A "kernel ... appears to have died" dialog fails the test at once:
        Run All would otherwise end quietly with no error output to show.
        """
        closed: list[str] = []
        dialogs = self.page.locator(".jp-Dialog")
        for _ in range(5):  # closing one dialog can reveal another
            if dialogs.count() == 0:
                break
            dialog = dialogs.first
            text = str(dialog.inner_text(timeout=2000))
            closed.append(text)
            self.dialogs_seen.append(text)
            if "appears to have died" in text:
                self.fail(f"the kernel of {self.path} died: {text!r}")
            accept = "select kernel" in text.lower()
            button = dialog.locator(
                ".jp-Dialog-button.jp-mod-accept" if accept else ".jp-Dialog-button.jp-mod-reject"
            )
            if button.count():
                button.first.click(timeout=5000)
            else:
                self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(200)
        toasts = self.page.locator(".jp-Notification-Toast-Close")
        for i in range(toasts.count()):
            try:
                toast = toasts.nth(i)
                text = str(toast.locator("xpath=..").inner_text(timeout=1000))
                toast.click(timeout=2000)
            except Exception:  # the toast closed on its own meanwhile
                continue
            closed.append(text)
            self.dialogs_seen.append(f"toast: {text}")
        return closed

    # -- running -------------------------------------------------------------------

    def run_all(self) -> None:
        """Start "Run All Cells" and return at once (see :meth:`wait_run_all`)."""
        self._state_or_fail()
        self.page.evaluate("p => window.__labtest.runAll(p)", self.path)

    def wait_run_all(self, timeout: float = RUN_TIMEOUT_S, *, expect_success: bool = True) -> bool:
        """Wait until Run All has finished and the kernel is idle; return whether all cells ran.

        With ``expect_success`` a cell that raised fails the test with the error output.
        """

        def done() -> tuple[bool, Any]:
            # The command resolves on the last execute_reply; the kernel's "idle" on
            # iopub comes after that request's outputs, so both together mean the last
            # outputs have arrived.  The kernel status alone is no "done" signal: a
            # background thread that updates a widget makes it flip to idle while a
            # cell is still running.
            run = self.page.evaluate("p => window.__labtest.run(p)", self.path)
            state = self._state()
            return bool(run and run["done"] and state.get("kernel") == "idle"), (run, state)

        self._wait(done, timeout, f"Run All of {self.path} to finish", on_tick=self.dismiss_dialogs)
        run = self.page.evaluate("p => window.__labtest.run(p)", self.path)
        if expect_success and not run["ok"]:
            errors = "\n---\n".join(self.error_outputs()) or run.get("error") or "<no error output>"
            self.fail(
                f"a cell of {self.path} failed during Run All:\n{errors}\nprompts: {self.prompts()}"
            )
        return bool(run["ok"])

    def run_notebook(
        self, name: str, cells: Sequence[str | Any], timeout: float = RUN_TIMEOUT_S
    ) -> None:
        """Write, open, run all cells and wait for the end: the one-call path for most tests."""
        self.write_notebook(name, cells)
        self.open_notebook(name)
        self.run_all()
        self.wait_run_all(timeout)

    # -- queries -------------------------------------------------------------------

    def cell(self, index: int) -> Locator:
        """Locator of cell ``index`` (0-based)."""
        return self.panel.locator(".jp-Notebook .jp-Cell").nth(index)

    def outputs(self, index: int, selector: str = ".jp-OutputArea-output") -> Locator:
        """Locator of the outputs of cell ``index`` matching ``selector``."""
        return self.cell(index).locator(selector)

    def prompts(self) -> list[str]:
        """Every cell's input prompt, in order (``"[ ]:"``, ``"[*]:"``, ``"[3]:"``)."""
        texts = self.panel.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").all_inner_texts()
        return [str(t).strip() for t in texts]

    def prompt(self, index: int) -> str:
        """The cell's input prompt, e.g. ``"[*]:"`` while it runs, ``"[3]:"`` after."""
        return str(self.cell(index).locator(".jp-InputPrompt").inner_text(timeout=5000)).strip()

    def is_running(self, index: int) -> bool:
        return "*" in self.prompt(index)

    def wait_cell_running(self, index: int, timeout: float = RUN_TIMEOUT_S) -> None:
        """Wait until cell ``index`` shows ``[*]`` (it is executing, not just queued)."""

        def running() -> tuple[bool, Any]:
            # Queued cells show [*] too; the cell is executing when every cell before it
            # has finished, i.e. has a number in its prompt.
            prompts = self.prompts()
            if index >= len(prompts):
                return False, prompts
            before_done = all(re.search(r"\d", p) for p in prompts[:index] if p.strip())
            return "*" in prompts[index] and before_done, prompts

        self._wait(running, timeout, f"cell {index} of {self.path} to be running")

    def wait_output(
        self, index: int, selector: str = ".jp-OutputArea-output", timeout: float = RUN_TIMEOUT_S
    ) -> Locator:
        """Wait until cell ``index`` has a visible output matching ``selector``; return it."""
        locator = self.outputs(index, selector).first

        def visible() -> tuple[bool, Any]:
            return locator.count() > 0 and locator.is_visible(), self.prompt(index)

        self._wait(visible, timeout, f"output {selector!r} of cell {index} in {self.path}")
        return locator

    def sample_html(
        self, locator: Locator, count: int = 2, interval: float = 1.5, attribute: str | None = None
    ) -> list[str]:
        """Read ``locator``'s inner HTML (or ``attribute``, e.g. ``"src"`` of an ``<img>``)
        ``count`` times, ``interval`` seconds apart: the way to see a live output change.
        """
        samples: list[str] = []
        for i in range(count):
            if i:
                self.page.wait_for_timeout(interval * 1000)
            value = locator.get_attribute(attribute) if attribute else locator.inner_html()
            samples.append(str(value))
        return samples

    def error_outputs(self) -> list[str]:
        """Texts of error/stderr outputs (tracebacks) anywhere in the notebook."""
        sel = (
            '.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"], '
            ".jp-OutputArea-output.jp-mod-error"
        )
        return [str(t) for t in self.panel.locator(sel).all_inner_texts()]

    def widget_errors(self) -> list[str]:
        """Texts of ipywidgets' "Error displaying widget" placeholders on the whole page."""
        body = str(self.page.locator("body").inner_text())
        return [line for line in body.splitlines() if "Error displaying widget" in line]

    def assert_no_widget_errors(self) -> None:
        errors = self.widget_errors()
        if errors:
            self.fail(f"widgets failed to render: {errors}")

    # -- artifacts and failure -----------------------------------------------------

    def screenshot(
        self, label: str, *, full_page: bool = True, locator: Locator | None = None
    ) -> Path:
        """Save a PNG as ``artifacts/browser/<test>-<label>.png`` and return its path."""
        path = self.artifacts / f"{self.test_name}-{_slug(label)}.png"
        if locator is not None:
            locator.screenshot(path=str(path), timeout=10_000)
        else:
            self.page.screenshot(path=str(path), full_page=full_page, timeout=10_000)
        self.screenshots.append(path)
        return path

    def save_failure_artifacts(self, reason: str) -> str:
        """Screenshot, server log tail and browser console into artifacts; return a summary."""
        self.failure_saved = True
        parts = [reason]
        try:
            parts.append(f"screenshot: {self.screenshot('FAILED')}")
        except Exception as exc:  # a crashed page must not hide the original failure
            parts.append(f"screenshot failed: {exc}")
        console = self.console
        report = (
            f"{reason}\n\n== dialogs/toasts closed ==\n{self.dialogs_seen}\n\n"
            f"== server log tail ({self.server.log_path}) ==\n"
            f"{self.server.log_tail()}\n\n== browser console ==\n"
            f"{console.tail() if console else '<not recorded>'}\n"
        )
        log_path = self.artifacts / f"{self.test_name}-FAILED.log"
        log_path.write_text(report)
        parts.append(f"server log + console: {log_path}")
        if self.dialogs_seen:
            parts.append(f"dialogs/toasts closed: {self.dialogs_seen}")
        parts.append(f"server log tail:\n{self.server.log_tail(12)}")
        if console:
            parts.append(f"browser console tail:\n{console.tail(10)}")
        return "\n".join(parts)

    def fail(self, reason: str) -> NoReturn:
        raise LabError(self.save_failure_artifacts(reason))

    # -- internals -----------------------------------------------------------------

    def _state_or_fail(self) -> dict[str, Any]:
        state = self._state()
        if not state.get("found"):
            self.fail(f"notebook {self.path!r} is not open (state: {state})")
        return state

    def _wait(
        self,
        check: Callable[[], tuple[bool, Any]],
        timeout: float,
        what: str,
        on_tick: Callable[[], object] | None = None,
        interval: float = 0.2,
    ) -> None:
        """Poll ``check`` until true; on timeout fail with the last state it reported.

        Also fails early when the server process has died, instead of waiting out the
        whole timeout.
        """
        deadline = time.monotonic() + timeout
        last: Any = None
        while True:
            ok, last = check()
            if ok:
                return
            if self.server.process.poll() is not None:
                self.fail(
                    f"JupyterLab died (code {self.server.process.returncode}) "
                    f"while waiting for {what}; last state: {last}"
                )
            if time.monotonic() > deadline:
                self.fail(f"timed out after {timeout:.0f} s waiting for {what}; last state: {last}")
            if on_tick is not None:
                on_tick()
            self.page.wait_for_timeout(interval * 1000)


@pytest.fixture
def lab(
    page: Page,
    console_log: ConsoleLog,
    lab_server: LabServer,
    artifacts_dir: Path,
    request: pytest.FixtureRequest,
) -> Iterator[LabPage]:
    """A :class:`LabPage` for this test; on failure it leaves a screenshot and logs behind."""
    helper = LabPage(page, lab_server, artifacts_dir, request.node.name, console_log)
    yield helper
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and not helper.failure_saved:
        # A LabError saved them already; this covers plain asserts in the test body.
        summary = helper.save_failure_artifacts(f"test {request.node.nodeid} failed")
        print(f"\n{summary}")
    lab_server.shutdown_sessions()


@pytest.fixture
def nb7(
    page: Page,
    console_log: ConsoleLog,
    notebook_server: LabServer,
    artifacts_dir: Path,
    request: pytest.FixtureRequest,
) -> Iterator[LabPage]:
    """A :class:`LabPage` on Jupyter Notebook 7; on failure it leaves a screenshot and logs."""
    helper = LabPage(page, notebook_server, artifacts_dir, f"nb7-{request.node.name}", console_log)
    yield helper
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and not helper.failure_saved:
        summary = helper.save_failure_artifacts(f"test {request.node.nodeid} failed")
        print(f"\n{summary}")
    notebook_server.shutdown_sessions()


def pytest_report_header(config: pytest.Config) -> list[str]:
    have = os.access(CHROMIUM, os.X_OK)
    return [
        f"browser tests: chromium {'found' if have else 'MISSING'} at {CHROMIUM}; "
        f"artifacts in {ARTIFACTS_DIR}"
    ]
