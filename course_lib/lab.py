"""``python -m course_lib lab``: start JupyterLab on the course's welcome notebook, safely.

What this adds to a plain ``jupyter lab``:

* **Local and authenticated by default.** The server listens on ``127.0.0.1`` and always requires a fresh random
  token. There is deliberately no option to disable or empty the token: a notebook server runs arbitrary code as
  you, so anyone who can reach it owns your account. Listening on another address (``--ip 0.0.0.0`` for a
  classroom) needs ``--allow-remote`` and prints a warning; the token is still required.
* **The token is handed over in the environment** (``JUPYTER_TOKEN``), not on the command line, because every user
  of a shared machine can read other people's command lines (``ps aux``) but not their environment.
* **A busy port is not an error by default**: the next free port above the requested one is used and the banner
  says so (in a workshop, two learners on one machine, or a forgotten server, must not block anyone); a port taken
  between that check and the server's start (two labs started at once) moves on the same way. An
  instructor who promised the room a fixed port passes ``--strict-port`` to get a clear error instead.
* **It opens the lesson, not a file browser**: ``notebooks/00_welcome.ipynb`` (JupyterLab's ``default_url``
  ``/lab/tree/<path>``), found relative to ``--notebook-dir``; ``--open`` picks another notebook.
* **Offline first**: JupyterLab's update check is switched off (it would contact the internet at start-up).
* **Locked whatever the user's Jupyter config says.** A ``~/.jupyter/jupyter_server_config.py`` with
  ``c.IdentityProvider.token = ""`` would switch authentication off. The launcher puts
  :mod:`course_lib.lab_auth` first on ``JUPYTER_CONFIG_PATH`` (the highest-priority config folder), whose config
  sets the token from ``JUPYTER_TOKEN``; then, before printing the banner, it *checks*: a request without the token
  must be refused. If it is not (some other setting opened the server), the server is stopped and the launcher
  refuses with an error naming the user's config folder.
* **The server dies with its launcher.** It runs in its own process group (kernels included); on Linux the kernel
  sends it ``SIGTERM`` when the launcher dies, however it dies (``prctl(PR_SET_PDEATHSIG)``, so even ``SIGKILL`` of
  the launcher leaves no server on the port), and Ctrl-C, ``SIGTERM`` or ``SIGHUP`` of the launcher stop it
  cleanly.

The pieces are plain functions so they can be tested and reused: :func:`build_command` returns a
:class:`LabCommand` (argv, extra environment, URL) without starting anything; :func:`main` is the CLI.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import webbrowser
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import course_lib.lab_auth
from course_lib.argparsing import CommandParser
from course_lib.labsettings import ensure_course_settings

DEFAULT_PORT = 8888
DEFAULT_IP = "127.0.0.1"
WELCOME_NOTEBOOK = "notebooks/00_welcome.ipynb"
# How many times to move on when the chosen port is taken before the server binds it (another lab started at once).
PORT_RETRIES = 3
# How far above the requested port to look for a free one before giving up.
PORT_SEARCH_SPAN = 50
# The folder whose jupyter_server_config.py forces the token (first on JUPYTER_CONFIG_PATH: it wins).
AUTH_CONFIG_DIR = str(Path(course_lib.lab_auth.__file__).resolve().parent)
STARTUP_TIMEOUT_S = 180.0


class LabError(RuntimeError):
    """The lab cannot start with the given options (the message says which option and what to do)."""


@dataclass(frozen=True)
class LabCommand:
    """Everything needed to start one JupyterLab server, built but not yet run.

    ``argv`` is the command line, ``env`` the variables to add to the current environment (the token lives here,
    see the module docstring), ``url`` the address to open, token included.
    """

    argv: list[str]
    env: dict[str, str]
    url: str
    token: str
    ip: str
    port: int
    notebook_dir: Path
    default_path: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        """``http://host:port`` without path or token (what an HTTP client talks to)."""
        host = f"[{self.ip}]" if ":" in self.ip else self.ip
        return f"http://{host}:{self.port}"


def new_token() -> str:
    """A fresh random token (48 hex characters = 192 bits) for one server run."""
    return secrets.token_hex(24)


def is_loopback(ip: str) -> bool:
    """True for addresses only this machine can reach (``127.0.0.1``, ``::1``, ``localhost``)."""
    if ip == "localhost":
        return True
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False  # a host name other than localhost: treat as reachable from outside


def port_is_free(port: int, ip: str = DEFAULT_IP) -> bool:
    """True when nothing listens on ``ip:port`` (we can bind it ourselves right now)."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((ip, port))
        except OSError:
            return False
    return True


def ephemeral_ports() -> range:
    """The ports the operating system hands out as the local end of outgoing connections (Linux's
    ``ip_local_port_range``; 32768-60999 where it cannot be read).

    A server waiting on such a port can be "answered" by the waiting client itself: a connection to an unused port
    in this range can get that very port as its own end, and the client then connects to itself and reads its own
    request back (a TCP self-connect). The lab keeps out of the range.
    """
    try:
        low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def free_port(ip: str = DEFAULT_IP) -> int:
    """A port that is free now and outside the ephemeral range (for tests and throw-away servers)."""
    ephemeral = ephemeral_ports()
    candidates = [port for port in range(20000, 32768) if port not in ephemeral] or list(range(1024, 20000))
    for port in secrets.SystemRandom().sample(candidates, min(200, len(candidates))):
        if port_is_free(port, ip):
            return port
    raise LabError(f"no free port found on {ip} outside the ephemeral range {ephemeral.start}-{ephemeral.stop - 1}.")


def choose_port(requested: int, ip: str = DEFAULT_IP, *, strict: bool = False) -> int:
    """Return ``requested`` if free, else the next free port above it (or raise :class:`LabError` if ``strict``)."""
    if not 1 <= requested <= 65535:
        raise LabError(f"--port {requested} is not a TCP port; use a number between 1024 and 65535, e.g. 8888.")
    if port_is_free(requested, ip):
        return requested
    if strict:
        raise LabError(
            f"port {requested} on {ip} is already in use (another Jupyter server?). Stop that server "
            f"(`jupyter server list` shows running ones), pick another --port, or drop --strict-port to use the "
            f"next free port automatically."
        )
    ephemeral = ephemeral_ports()
    for candidate in range(requested + 1, min(requested + PORT_SEARCH_SPAN, 65535) + 1):
        if candidate not in ephemeral and port_is_free(candidate, ip):
            return candidate
    raise LabError(
        f"ports {requested}..{requested + PORT_SEARCH_SPAN} on {ip} are all in use; pass a different --port."
    )


def _running_as_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def find_default_notebook(notebook_dir: Path, wanted: str | None = None) -> str | None:
    """The notebook to open, as a ``/``-separated path relative to ``notebook_dir`` (``None``: open the launcher).

    ``wanted`` is taken relative to ``notebook_dir``; without it the welcome notebook is looked for both as
    ``notebooks/00_welcome.ipynb`` (serving the repository root) and ``00_welcome.ipynb`` (serving ``notebooks/``).
    """
    candidates = [wanted] if wanted else [WELCOME_NOTEBOOK, Path(WELCOME_NOTEBOOK).name]
    for candidate in candidates:
        if (notebook_dir / candidate).is_file():
            return Path(candidate).as_posix()
    return None


def _checked_root(*, port: int, notebook_dir: str | os.PathLike[str], ip: str, token: str | None,
                  allow_remote: bool, open_path: str | None) -> Path:
    """Refuse a bad option before anything starts (one clear error each); returns the notebook folder, resolved."""
    if token is not None and not token.strip():
        raise LabError("the token must not be empty: an unauthenticated notebook server runs anyone's code as you.")
    if not is_loopback(ip) and not allow_remote:
        raise LabError(
            f"--ip {ip} would let other machines reach this notebook server. Keep the default {DEFAULT_IP}, "
            f"or add --allow-remote if you really mean to serve a network (the token is still required)."
        )
    if not 1 <= port <= 65535:
        raise LabError(f"--port {port} is not a TCP port; use a number between 1024 and 65535, e.g. 8888.")
    root = Path(notebook_dir).expanduser().resolve()
    if not root.is_dir():
        raise LabError(f"--notebook-dir {notebook_dir!s} is not a directory; pass the folder holding the notebooks.")
    if open_path is not None and find_default_notebook(root, open_path) is None:
        raise LabError(f"--open {open_path}: no such notebook under {root}; give a path relative to --notebook-dir.")
    return root


def build_command(
    *,
    port: int = DEFAULT_PORT,
    notebook_dir: str | os.PathLike[str] = ".",
    ip: str = DEFAULT_IP,
    token: str | None = None,
    open_browser: bool = True,
    allow_remote: bool = False,
    open_path: str | None = None,
    extra_args: Sequence[str] = (),
    python: str = sys.executable,
) -> LabCommand:
    """Build (but do not run) the JupyterLab command for these options, checking them first.

    ``port`` is used as given (call :func:`choose_port` first to handle a busy port). ``token=None`` draws a fresh
    one; an empty token is refused. ``extra_args`` are appended as-is (tests use them for temporary settings
    directories).
    """
    root = _checked_root(port=port, notebook_dir=notebook_dir, ip=ip, token=token, allow_remote=allow_remote,
                         open_path=open_path)
    token = token or new_token()
    default_path = find_default_notebook(root, open_path)
    notes: list[str] = []
    if default_path is None:
        notes.append(f"{WELCOME_NOTEBOOK} was not found under {root}; opening the launcher instead.")
    default_url = f"/lab/tree/{default_path}" if default_path else "/lab"

    argv = [
        python, "-m", "jupyterlab",
        f"--ServerApp.ip={ip}",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",  # we chose the port ourselves; never drift silently to another one
        f"--ServerApp.root_dir={root}",
        f"--LabApp.default_url={default_url}",
        f"--ServerApp.open_browser={open_browser}",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",  # offline first: no phoning home
        *extra_args,
    ]
    if _running_as_root():
        # Containers often run everything as root; JupyterLab refuses that unless told. The token still applies.
        argv.insert(3, "--ServerApp.allow_root=True")
        notes.append("running as root (common in containers): allowed, but prefer a normal user account.")
    existing = os.environ.get("JUPYTER_CONFIG_PATH")
    env = {"JUPYTER_TOKEN": token,
           "JUPYTER_CONFIG_PATH": AUTH_CONFIG_DIR + (os.pathsep + existing if existing else "")}
    host = f"[{ip}]" if ":" in ip else ip
    url = f"http://{host}:{port}{default_url}?token={token}"
    return LabCommand(argv=argv, env=env, url=url, token=token, ip=ip, port=port, notebook_dir=root,
                      default_path=default_path, notes=notes)


def banner(cmd: LabCommand, *, requested_port: int | None = None) -> str:
    """The message printed before the server starts: where to point the browser, with the token."""
    lines = ["", "=" * 78, "  Course lab: JupyterLab is starting.", ""]
    if requested_port is not None and requested_port != cmd.port:
        lines += [f"  Port {requested_port} is in use, so this lab uses port {cmd.port}.", ""]
    lines += [
        "  Open this address in your browser (the token in it is your password):",
        "",
        f"      {cmd.url}",
        "",
        f"  token:        {cmd.token}",
        f"  notebook dir: {cmd.notebook_dir}",
    ]
    lines += [f"  note:         {note}" for note in cmd.notes]
    lines += ["", "  Stop the lab with Ctrl-C.", "=" * 78, ""]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="python -m course_lib lab",
        description="Launch JupyterLab on the course's welcome notebook, on 127.0.0.1, protected by a token.",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT,
                        help=f"port to serve on (default {DEFAULT_PORT}); if busy, the next free one is used")
    parser.add_argument("--strict-port", action="store_true",
                        help="fail with an error instead of moving to the next free port")
    parser.add_argument("--notebook-dir", default=".", help="folder JupyterLab serves (default: current folder)")
    parser.add_argument("--open", dest="open_path", default=None,
                        help=f"notebook to open, relative to --notebook-dir (default: {WELCOME_NOTEBOOK})")
    parser.add_argument("--ip", default=DEFAULT_IP, help=f"address to listen on (default {DEFAULT_IP}: this machine)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a non-local --ip such as 0.0.0.0 (a classroom server); prints a warning")
    parser.add_argument("--no-browser", action="store_true", help="do not open a browser window")
    parser.add_argument("--dry-run", action="store_true", help="print the command that would run, and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point (registered as ``python -m course_lib lab``). Returns the server's exit code."""
    args = _parser().parse_args(list(argv) if argv is not None else None)
    try:
        if not is_loopback(args.ip) and args.allow_remote:
            print(
                f"WARNING: serving on {args.ip}: other machines on this network can reach this notebook server. "
                "Only the token protects it; share it only with your room, and stop the server after the session.",
                file=sys.stderr,
            )
        # Validate everything (ip, directory, notebook) before probing ports, so bad input fails first.
        build_command(port=args.port, notebook_dir=args.notebook_dir, ip=args.ip, token="check",
                      allow_remote=args.allow_remote, open_path=args.open_path)
        probe_ip = "127.0.0.1" if args.ip == "localhost" else args.ip
        port = choose_port(args.port, probe_ip, strict=args.strict_port)
        cmd = build_command(port=port, notebook_dir=args.notebook_dir, ip=args.ip,
                            open_browser=False,  # opened by us once the server is verified locked
                            allow_remote=args.allow_remote, open_path=args.open_path)
    except LabError as err:
        print(f"course lab: {err}", file=sys.stderr)
        return 2

    if args.dry_run:
        print(" ".join(cmd.argv))
        print(f"environment: JUPYTER_TOKEN=<token> JUPYTER_CONFIG_PATH={cmd.env['JUPYTER_CONFIG_PATH']}")
        print(cmd.url)
        return 0
    ensure_course_settings()  # saved lessons reopen with their widgets, not "model not found"
    print(f"Starting JupyterLab on port {cmd.port}...", flush=True)
    process = start_server(cmd)
    stopping: dict[str, float] = {}

    def request_stop(*_: object) -> None:
        """Ask the server's whole group to stop (signal handlers only signal: the main loop does the waiting)."""
        if "since" not in stopping:
            stopping["since"] = time.monotonic()
            _signal_group(process, signal.SIGTERM)

    for name in ("SIGTERM", "SIGHUP"):
        # A service manager, `timeout` or a closed terminal stops us: the server goes first.
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), request_stop)
    try:
        for retries_left in range(PORT_RETRIES, -1, -1):
            try:
                wait_until_ready(cmd, process)
                break
            except LabError:
                # Free when we looked, taken when the server bound it (two labs started at once): take the next one,
                # unless the port was promised (--strict-port) or the server failed for another reason.
                if (stopping or args.strict_port or not retries_left or process.poll() is None
                        or port_is_free(cmd.port, probe_ip)):
                    raise
                port = choose_port(cmd.port + 1, probe_ip)
                print(f"Port {cmd.port} was taken while JupyterLab started; trying port {port}...", flush=True)
                cmd = build_command(port=port, notebook_dir=args.notebook_dir, ip=args.ip, open_browser=False,
                                    allow_remote=args.allow_remote, open_path=args.open_path)
                process = start_server(cmd)
        verify_locked(cmd)
    except LabError as err:
        asked_to_stop = bool(stopping)  # a signal during start-up: stopping is what was wanted, not an error
        if not asked_to_stop:
            print(f"course lab: error: {err}", file=sys.stderr)
        request_stop()
        _reap(process, stopping, request_stop)
        return 0 if asked_to_stop else 1
    except KeyboardInterrupt:
        request_stop()
        return _reap(process, stopping, request_stop)
    print(banner(cmd, requested_port=args.port), flush=True)
    if not args.no_browser:
        webbrowser.open(cmd.url)
    return _reap(process, stopping, request_stop)


# ------------------------------------------------------------------------------------------ the server process
def _die_with_parent(parent: int) -> Callable[[], None]:
    """A ``preexec_fn``: on Linux, ask the kernel to SIGTERM this child when its parent (the launcher) dies."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork: nothing to import in the child
    except (OSError, ImportError):  # pragma: no cover - no C library to call
        libc = None

    def preexec() -> None:
        if libc is not None and sys.platform.startswith("linux"):
            libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the launcher died before prctl took effect
                os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def start_server(cmd: LabCommand) -> subprocess.Popen:
    """Start the server in its own process group, tied to this process's life (see the module docstring)."""
    posix = os.name == "posix"
    return subprocess.Popen(
        cmd.argv, env={**os.environ, **cmd.env},
        stdin=subprocess.DEVNULL,  # it never reads the terminal (a background group reading it would be stopped)
        start_new_session=posix,
        preexec_fn=_die_with_parent(os.getpid()) if posix else None,
    )


def _signal_group(process: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the server's process group (the server and its kernels)."""
    try:
        if os.name == "posix":
            os.killpg(process.pid, signum)
        else:  # pragma: no cover
            process.terminate()
    except ProcessLookupError:
        pass


def _reap(process: subprocess.Popen, stopping: dict[str, float], request_stop: Callable[[], None],
          grace: float = 10.0) -> int:
    """Wait for the server to exit; Ctrl-C asks it to stop; a stop that takes over ``grace`` s becomes SIGKILL.

    Returns 0 after a requested stop, else the server's own exit code.
    """
    while True:
        try:
            code = process.wait(timeout=0.5)
            return 0 if stopping else code
        except subprocess.TimeoutExpired:
            if "since" in stopping and time.monotonic() - stopping["since"] > grace:
                _signal_group(process, signal.SIGKILL)
        except KeyboardInterrupt:
            if "since" not in stopping:
                print("\nStopping the lab...", flush=True)
            request_stop()


def _http_status(cmd: LabCommand, path: str, token: str | None, timeout: float = 3.0) -> int:
    """The HTTP status of ``GET path`` (redirects are *not* followed: a redirect to the login page is a refusal)."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "localhost": "127.0.0.1"}.get(cmd.ip, cmd.ip)
    connection = http.client.HTTPConnection(host, cmd.port, timeout=timeout)
    try:
        connection.connect()
        if connection.sock.getsockname()[:2] == connection.sock.getpeername()[:2]:
            raise ConnectionRefusedError(f"port {cmd.port}: connected to itself (a TCP self-connect), no server yet")
        connection.request("GET", path, headers={"Authorization": f"token {token}"} if token else {})
        return connection.getresponse().status
    finally:
        connection.close()


def wait_until_ready(cmd: LabCommand, process: subprocess.Popen, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Wait until the server answers an authenticated request; :class:`LabError` if it exits or never answers."""
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            raise LabError(f"JupyterLab exited with code {process.returncode} before it was ready; its messages above "
                           f"say why.")
        try:
            if _http_status(cmd, "/api/status", cmd.token) == 200:
                return
        except (OSError, http.client.HTTPException):  # not up yet, or something else answers there: ask again
            pass
        if time.monotonic() > deadline:
            raise LabError(f"JupyterLab did not answer on port {cmd.port} within {timeout:.0f} s.")
        time.sleep(0.25)


def verify_locked(cmd: LabCommand) -> None:
    """Raise :class:`LabError` unless a request *without* the token is refused (401/403, or a redirect to login).

    It asks for the lab's page, which a locked server answers with a redirect to its login page: an API path would
    be refused as well, but the server logs that refusal as an error ("wrote error: 'Forbidden'") at every start."""
    status = _http_status(cmd, "/lab", None)
    if status in (401, 403) or 300 <= status < 400:
        return
    config_dir = os.environ.get("JUPYTER_CONFIG_DIR") or str(Path.home() / ".jupyter")
    raise LabError(
        f"the server answered a request without the token (HTTP {status}): something in your Jupyter configuration "
        f"switches authentication off, so anyone who can reach port {cmd.port} could run code as you. The server "
        f"was stopped. Remove the setting (look for token, password, identity_provider_class or authorizer_class in "
        f"{config_dir}/jupyter_server_config.py or .json) and start the lab again."
    )
