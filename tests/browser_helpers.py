"""Test helpers: a throw-away JupyterLab server, and a headless Chromium driven by Playwright.

The server is started through :func:`course_lib.lab.build_command` (so the tests exercise the real command line)
on a free local port, with its own token and temporary settings, workspace and runtime folders, so a test never
reads or writes the developer's JupyterLab state.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from course_lib import lab, labsettings

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync",
]

# User settings for the test server: no news/update toasts over the notebook, no "kernel is busy" dialogs. Autosave
# is left to the course's own settings overrides (off), which the tests check.
TEST_USER_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    # Render every cell (no virtual scrolling), so the test sees all outputs of a long notebook.
    "@jupyterlab/notebook-extension:tracker": {"windowingMode": "none"},
}


def get_status(base_url: str, token: str | None, timeout: float = 2.0) -> tuple[int, dict | None]:
    """GET ``/api/status``; returns (HTTP status, JSON body or None)."""
    headers = {"Authorization": f"token {token}"} if token else {}
    request = urllib.request.Request(f"{base_url}/api/status", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, None


@dataclass
class LabServer:
    """A running test server: the command it was started with, its process and its log file."""

    command: lab.LabCommand
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])

    def url(self, path: str) -> str:
        """Absolute URL for ``path`` on this server, with the token (sets the login cookie in a browser)."""
        sep = "&" if "?" in path else "?"
        return f"{self.command.base_url}{path}{sep}token={self.command.token}"


def write_user_settings(settings_dir: Path, settings: dict[str, dict]) -> None:
    """Write JupyterLab user settings (``<dir>/<package>/<plugin>.jupyterlab-settings``)."""
    for plugin_id, values in settings.items():
        package, plugin = plugin_id.split(":")
        path = settings_dir / package / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))


@contextmanager
def running_lab(
    notebook_dir: Path, state_dir: Path, *, env: dict[str, str] | None = None, startup_timeout: float = 90.0,
    open_path: str | None = None,
) -> Iterator[LabServer]:
    """Start JupyterLab on a free port serving ``notebook_dir``; yield once ``/api/status`` answers; stop it."""
    settings_dir, workspaces_dir, runtime_dir, app_settings_dir = (
        state_dir / n for n in ("settings", "workspaces", "runtime", "app-settings"))
    for folder in (settings_dir, workspaces_dir, runtime_dir, state_dir / "ipython"):
        folder.mkdir(parents=True, exist_ok=True)
    write_user_settings(settings_dir, TEST_USER_SETTINGS)
    # The overrides the course's launcher writes into the environment, here into a throw-away app settings folder.
    labsettings.ensure_course_settings(app_settings_dir)
    command = lab.build_command(
        port=lab.free_port(), notebook_dir=notebook_dir, open_browser=False, open_path=open_path,
        extra_args=[
            f"--LabApp.user_settings_dir={settings_dir}",
            f"--LabApp.workspaces_dir={workspaces_dir}",
            f"--LabApp.app_settings_dir={app_settings_dir}",
            "--LabApp.expose_app_in_browser=True",  # lets the browser test ask the app for cell states
        ],
    )
    full_env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(runtime_dir),
        "IPYTHONDIR": str(state_dir / "ipython"),
        "COURSE_MODE": "smoke",
        **(env or {}),
        **command.env,
    }
    full_env.pop("MPLBACKEND", None)  # let the kernel use its inline backend, as on a learner's machine
    full_env.pop("COURSE_UNATTENDED", None)  # a browser is a learner: questions wait for an answer
    log_path = state_dir / "jupyterlab.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command.argv, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = LabServer(command=command, process=process, log_path=log_path)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {process.returncode}:\n{server.log_tail()}")
            try:
                if get_status(command.base_url, command.token)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"JupyterLab did not answer within {startup_timeout} s:\n{server.log_tail()}")
            time.sleep(0.25)
        yield server
    finally:
        stop(process)


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a server we started (SIGTERM, then SIGKILL), kernels included (they share its process group)."""
    if process.poll() is None:
        try:
            os.killpg(process.pid, 15)
        except ProcessLookupError:
            return
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()


def chromium_missing_reason() -> str | None:
    """Why the browser test cannot run here, or None when Chromium and Playwright are both available."""
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        return (f"{CHROMIUM} not found: install Debian's chromium (`apt-get install chromium`) to run the "
                "browser test")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: `pip install -e '.[dev]'`"
    return None
