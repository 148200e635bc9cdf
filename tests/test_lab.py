"""`python -m course_lib lab`: the command it builds, and a real server that demands its token."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from browser_helpers import get_status, running_lab
from course_lib import lab


def _notebook_tree(root: Path) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "notebooks" / "00_welcome.ipynb").write_text("{}")
    return root


def _option(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, f"--{name} given {len(values)} times in {argv}"
    return values[0]


def test_command_binds_localhost_with_a_token_port_and_directory(tmp_path):
    root = _notebook_tree(tmp_path)
    cmd = lab.build_command(port=8765, notebook_dir=root)
    assert cmd.argv[1:3] == ["-m", "jupyterlab"]
    assert _option(cmd.argv, "ServerApp.ip") == "127.0.0.1"
    assert _option(cmd.argv, "ServerApp.port") == "8765"
    assert _option(cmd.argv, "ServerApp.root_dir") == str(root.resolve())
    assert _option(cmd.argv, "LabApp.default_url") == "/lab/tree/notebooks/00_welcome.ipynb"
    # The token travels in the environment (not visible in `ps`), is long and random, and is in the URL.
    assert len(cmd.env["JUPYTER_TOKEN"]) >= 32 and cmd.env["JUPYTER_TOKEN"] == cmd.token
    assert lab.build_command(port=8765, notebook_dir=root).token != cmd.token
    assert not any("token" in a.lower() for a in cmd.argv), "the token must never be disabled or set on argv"
    assert cmd.url == f"http://127.0.0.1:8765/lab/tree/notebooks/00_welcome.ipynb?token={cmd.token}"
    assert cmd.token in lab.banner(cmd)


def test_welcome_notebook_found_when_serving_the_notebooks_folder(tmp_path):
    root = _notebook_tree(tmp_path)
    cmd = lab.build_command(notebook_dir=root / "notebooks", token="t" * 32, open_browser=False)
    assert _option(cmd.argv, "LabApp.default_url") == "/lab/tree/00_welcome.ipynb"
    assert _option(cmd.argv, "ServerApp.open_browser") == "False"
    bare = lab.build_command(notebook_dir=tmp_path / "notebooks" / "..", token="t" * 32)
    assert bare.default_path == "notebooks/00_welcome.ipynb"


def test_missing_welcome_notebook_opens_the_launcher_with_a_note(tmp_path):
    cmd = lab.build_command(notebook_dir=tmp_path)
    assert _option(cmd.argv, "LabApp.default_url") == "/lab"
    assert cmd.notes and "00_welcome" in cmd.notes[0]


@pytest.mark.parametrize("kwargs, words", [
    ({"ip": "0.0.0.0"}, "--allow-remote"),
    ({"token": ""}, "empty"),
    ({"token": "   "}, "empty"),
    ({"port": 0}, "--port"),
    ({"port": 70000}, "--port"),
    ({"open_path": "nope.ipynb"}, "--open"),
])
def test_bad_options_are_refused_with_a_reason(tmp_path, kwargs, words):
    with pytest.raises(lab.LabError, match=words):
        lab.build_command(notebook_dir=tmp_path, **kwargs)


def test_missing_directory_is_refused(tmp_path):
    with pytest.raises(lab.LabError, match="--notebook-dir"):
        lab.build_command(notebook_dir=tmp_path / "absent")


def test_remote_ip_needs_allow_remote_and_warns(tmp_path, capsys):
    cmd = lab.build_command(notebook_dir=tmp_path, ip="0.0.0.0", allow_remote=True)
    assert _option(cmd.argv, "ServerApp.ip") == "0.0.0.0" and cmd.token
    assert lab.main(["--ip", "0.0.0.0", "--notebook-dir", str(tmp_path)]) == 2
    assert "--allow-remote" in capsys.readouterr().err
    assert lab.main(["--ip", "0.0.0.0", "--allow-remote", "--dry-run", "--notebook-dir", str(tmp_path)]) == 0
    assert "WARNING" in capsys.readouterr().err


def test_busy_port_moves_on_or_fails_when_strict():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", lab.free_port()))
        busy.listen()
        port = busy.getsockname()[1]
        assert not lab.port_is_free(port)
        chosen = lab.choose_port(port)
        assert chosen > port and lab.port_is_free(chosen)
        with pytest.raises(lab.LabError, match="in use"):
            lab.choose_port(port, strict=True)


def test_dry_run_prints_the_command_and_the_url(tmp_path, capsys):
    root = _notebook_tree(tmp_path)
    assert lab.main(["--port", str(lab.free_port()), "--notebook-dir", str(root), "--no-browser", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "jupyterlab" in out and "--ServerApp.open_browser=False" in out and "token=" in out


@pytest.mark.slow
def test_real_server_requires_the_token(tmp_path):
    root = _notebook_tree(tmp_path / "root")
    with running_lab(root, tmp_path / "state") as server:
        status, body = get_status(server.command.base_url, server.command.token)
        assert status == 200 and "started" in body
        assert get_status(server.command.base_url, None)[0] == 403
        assert get_status(server.command.base_url, "wrong-token")[0] == 403
    assert server.process.poll() is not None, "the server must be stopped after the test"


# ---------------------------------------------------------------------------------- locked whatever the config
def _serve_status(status: int):
    """A throw-away HTTP server answering every GET with ``status`` (stands in for a misconfigured lab)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # the name the http.server API calls
            self.send_response(status)
            if 300 <= status < 400:
                self.send_header("Location", "/login")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("status, locked", [(403, True), (401, True), (302, True), (200, False)])
def test_verify_locked_refuses_a_server_that_answers_without_the_token(tmp_path, status, locked):
    server = _serve_status(status)
    try:
        cmd = lab.build_command(port=server.server_address[1], notebook_dir=tmp_path)
        if locked:
            lab.verify_locked(cmd)
        else:
            with pytest.raises(lab.LabError, match="without the token"):
                lab.verify_locked(cmd)
    finally:
        server.shutdown()


def test_the_course_config_comes_first_on_the_jupyter_config_path(tmp_path, monkeypatch):
    monkeypatch.setenv("JUPYTER_CONFIG_PATH", "/somewhere/else")
    cmd = lab.build_command(notebook_dir=tmp_path)
    first, rest = cmd.env["JUPYTER_CONFIG_PATH"].split(os.pathsep, 1)
    assert first == lab.AUTH_CONFIG_DIR and rest == "/somewhere/else"
    assert "IdentityProvider.token" in (Path(first) / "jupyter_server_config.py").read_text()


def _port_answers(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
def test_lab_stays_locked_with_a_token_emptying_user_config_and_dies_with_its_launcher(tmp_path, how):
    """A user config with ``c.IdentityProvider.token = ""`` (which alone turns authentication off) cannot open the
    course lab; and SIGKILL (no clean-up possible) or SIGHUP (terminal closed) of the launcher takes the server
    down with it."""
    home = tmp_path / "home"
    user_config = home / ".jupyter"
    user_config.mkdir(parents=True)
    (user_config / "jupyter_server_config.py").write_text('c.IdentityProvider.token = ""\n')
    root = _notebook_tree(tmp_path / "root")
    port = lab.free_port()
    env = {**os.environ, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(user_config),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "ws"),
           "PYTHONPATH": str(Path(lab.__file__).resolve().parents[1])}
    env.pop("JUPYTER_TOKEN", None)
    launcher = subprocess.Popen(
        [sys.executable, "-m", "course_lib", "lab", "--port", str(port), "--strict-port", "--no-browser",
         "--notebook-dir", str(root)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        assert launcher.stdout is not None
        deadline = time.monotonic() + 240
        token = None
        while token is None:
            line = launcher.stdout.readline()
            assert line or launcher.poll() is None, "".join(lines)
            assert time.monotonic() < deadline, "no banner within 240 s:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("token:"):
                token = line.split(":", 1)[1].strip()
        base = f"http://127.0.0.1:{port}"
        assert get_status(base, None)[0] == 403, "the user config must not switch authentication off"
        assert get_status(base, token)[0] == 200
        launcher.send_signal(getattr(signal, how))
        launcher.wait(60)
        deadline = time.monotonic() + 60
        while _port_answers(port):
            assert time.monotonic() < deadline, "the server outlived its launcher by 60 s"
            time.sleep(0.5)
    finally:
        if launcher.poll() is None:
            launcher.kill()
        try:
            os.killpg(launcher.pid, signal.SIGKILL)  # whatever is left of its group (nothing, when all went well)
        except ProcessLookupError:
            pass


class _FakeServer:
    """A server process as ``main`` sees it: exited at once (its port was taken), or running until stopped."""

    def __init__(self, exits: bool) -> None:
        self.returncode = 1 if exits else None
        self.pid = -1

    def poll(self):
        return self.returncode

    def wait(self, timeout=None):
        self.returncode = 0
        return 0


def test_a_port_taken_while_the_server_starts_moves_to_the_next_free_one(tmp_path, capsys, monkeypatch):
    """Seen: a second `course lab` started beside a first failed instead of taking another port (the first took the
    port between the second's check and its server's start)."""
    root = _notebook_tree(tmp_path)
    port = lab.free_port()
    started: list[int] = []
    with socket.socket() as thief:
        def start(cmd):
            started.append(cmd.port)
            if len(started) == 1:  # the other lab binds the port now, and this server exits
                thief.bind(("127.0.0.1", cmd.port))
                thief.listen()
                return _FakeServer(exits=True)
            return _FakeServer(exits=False)

        monkeypatch.setattr(lab, "start_server", start)
        monkeypatch.setattr(lab, "_http_status", lambda cmd, path, token, timeout=3.0: 200 if token else 403)
        monkeypatch.setattr(lab, "ensure_course_settings", lambda: None)
        handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
        try:
            code = lab.main(["--port", str(port), "--notebook-dir", str(root), "--no-browser"])
        finally:
            for signum, handler in handlers.items():  # main installs its own: this process keeps the test runner's
                signal.signal(signum, handler)
    out = capsys.readouterr().out
    assert code == 0, out
    assert started[0] == port and len(started) == 2 and started[1] > port
    assert f"trying port {started[1]}" in out and f"uses port {started[1]}" in out


def _answering_server(answers: list[bytes | None]) -> tuple[int, threading.Thread]:
    """A TCP server on a free port that answers its n-th connection with ``answers[n]`` (None: a reset), once each."""

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(len(answers))

    def serve() -> None:
        with listener:
            for answer in answers:
                conn, _ = listener.accept()
                with conn:
                    conn.recv(4096)
                    if answer is None:  # RST instead of FIN: the client sees "connection reset"
                        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    else:
                        conn.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener.getsockname()[1], thread


def test_the_readiness_probe_survives_anything_a_port_can_answer(tmp_path: Path) -> None:
    """Seen: `course lab` crashed with http.client.BadStatusLine ('GET /api/status HTTP/1.1': its own request, read
    back through a TCP self-connect) instead of asking again."""
    echo = b"GET /api/status HTTP/1.1\r\nHost: x\r\n\r\n"  # what a self-connect reads back
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    port, thread = _answering_server([echo, b"\x00\xffnot http\r\n\r\n", None, ok])
    cmd = lab.LabCommand(argv=[], env={}, url="", token="t", ip="127.0.0.1", port=port, notebook_dir=tmp_path)
    lab.wait_until_ready(cmd, _FakeServer(exits=False), timeout=30)
    thread.join(timeout=5)
    assert not thread.is_alive(), "the probe returned before the server's 200"


def test_ports_the_lab_picks_stay_out_of_the_ephemeral_range() -> None:
    ephemeral = lab.ephemeral_ports()
    assert len(ephemeral) > 1000
    assert all(lab.free_port() not in ephemeral for _ in range(20))
    start = ephemeral.start - 3  # a search that would walk into the range skips it
    with socket.socket() as a, socket.socket() as b, socket.socket() as c:
        taken = []
        for sock, port in zip((a, b, c), range(start, start + 3)):
            try:
                sock.bind(("127.0.0.1", port))
                sock.listen(1)
                taken.append(port)
            except OSError:
                pytest.skip(f"port {port} is in use here")
        with pytest.raises(lab.LabError, match="all in use"):  # the next free ports are ephemeral: not taken
            lab.choose_port(start)


@pytest.mark.slow
def test_a_lab_start_logs_no_warning_and_serves_a_lesson_as_its_kernel_will_fill_it(tmp_path):
    """Seen at every start: "Overriding existing pre_save_hook (keep_stored_metadata)" and "wrote error:
    'Forbidden'" (the launcher's lock check). And a stored lesson is served with the metadata its kernel will report
    (so JupyterLab finds nothing to change on opening it), while saving it back writes the stored bytes."""
    import json

    from course_lib.labcontents import kernel_language_info

    root = _notebook_tree(tmp_path / "root")
    lesson = root / "lesson.ipynb"
    stored = ('{\n "cells": [],\n "metadata": {\n  "kernelspec": {\n   "display_name": "Python 3",\n   "language": '
              '"python",\n   "name": "python3"\n  },\n  "language_info": {\n   "name": "python"\n  }\n },\n'
              ' "nbformat": 4,\n "nbformat_minor": 5\n}\n')
    lesson.write_text(stored)
    with running_lab(root, tmp_path / "state") as server:
        lab.verify_locked(server.command)
        import urllib.request

        def api(method: str, body: dict | None = None) -> dict:
            request = urllib.request.Request(
                f"{server.command.base_url}/api/contents/lesson.ipynb", method=method,
                data=None if body is None else json.dumps(body).encode(),
                headers={"Authorization": f"token {server.command.token}", "Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())

        served = api("GET")["content"]["metadata"]
        assert served["language_info"] == kernel_language_info()
        assert served["kernelspec"]["name"] == "python3" and served["kernelspec"]["display_name"] != "Python 3"
        api("PUT", {"type": "notebook", "format": "json", "content": api("GET")["content"]})
        assert lesson.read_text() == stored, "saving the served lesson changed it on disk"
        time.sleep(1)  # let the server write its log
        log = server.log_path.read_text(errors="replace")
    assert "Overriding existing pre_save_hook" not in log and "wrote error" not in log, log[-3000:]
