# SPDX-License-Identifier: MIT
"""A private, throw-away PostgreSQL cluster that the chaos run may crash at will.

``PgCluster.create()`` runs ``initdb`` into a fresh directory, starts the server with
``pg_ctl`` on a free TCP port of 127.0.0.1 (its Unix socket in the same directory, set
as ``unix_socket_directories``, the setting behind ``-k``; the directory is a short
temporary one, as a socket path is limited to about 100 bytes), and ``restart()`` stops
it with ``-m immediate`` (a crash: no checkpoint, no goodbye to the clients; the next
start runs crash recovery) before starting it again. ``close()`` stops it and removes
the directory; it also runs at interpreter exit, and a detached watchdog does it if
this process is killed, so a run never leaves a server behind.

PostgreSQL refuses to run as root: when this process is root, every server command
runs as the ``postgres`` user (``runuser -u postgres --``) in a directory that user
owns. The shared server of the test suite (port 5432) is never touched.

Settings: ``fsync`` and ``full_page_writes`` are off (the faults are process crashes,
never power cuts, and the kernel keeps what a crashed server wrote), and
``synchronous_commit`` stays on: a commit the client saw survives an immediate
shutdown, so a message the checker finds lost is lost for real.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

__all__ = ["PgCluster", "PgClusterError", "find_bindir"]

SERVER_USER = "postgres"
START_TIMEOUT = 60  # seconds pg_ctl waits for the server (crash recovery included)
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "max_connections": "300",
    "fsync": "off",
    "full_page_writes": "off",
    "synchronous_commit": "on",
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


class PgClusterError(RuntimeError):
    """The private cluster could not be created, started or restarted."""


def find_bindir(explicit: str | None = None) -> str | None:
    """The directory of ``initdb`` and ``pg_ctl``: ``explicit``, ``$PG_BINDIR``,
    ``/usr/lib/postgresql/<newest>/bin``, ``pg_config --bindir``, or ``PATH``."""
    candidates: list[str] = []
    if explicit:
        candidates.append(explicit)
    if os.environ.get("PG_BINDIR"):
        candidates.append(os.environ["PG_BINDIR"])

    def version(path: str) -> tuple[int, ...]:
        name = Path(path).parent.name
        return tuple(int(x) for x in name.split(".") if x.isdigit())

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            )
            candidates.append(out.stdout.strip())
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).parent))
    for directory in candidates:
        if os.access(os.path.join(directory, "initdb"), os.X_OK) and os.access(
            os.path.join(directory, "pg_ctl"), os.X_OK
        ):
            return directory
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class PgCluster:
    """One private cluster. Use :meth:`create`; see the module docstring.

    Attributes:
        root: the directory holding the data directory, the socket and the server log.
        port: the TCP port on 127.0.0.1.
        restarts: how many immediate restarts were done.
    """

    def __init__(self, bindir: str, root: Path, port: int) -> None:
        self.bindir = bindir
        self.root = root
        self.port = port
        self.restarts = 0
        self._as_user: list[str] = []
        self._owner: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise PgClusterError("running as root, but runuser is not installed")
            try:
                self._owner = pwd.getpwnam(SERVER_USER)
            except KeyError:
                raise PgClusterError(
                    f"running as root, but there is no {SERVER_USER!r} user to run the server"
                ) from None
            self._as_user = [runuser, "-u", SERVER_USER, "--"]
        self._closed = False
        self._watchdog: subprocess.Popen[bytes] | None = None

    # -- paths
    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    def url(self, application_name: str | None = None, dbname: str = "postgres") -> str:
        """A libpq URL over TCP, optionally naming the connecting application."""
        url = f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"
        return f"{url}?application_name={application_name}" if application_name else url

    # -- lifecycle
    @classmethod
    def create(cls, bindir: str) -> PgCluster:
        """initdb a new cluster in a new temporary directory and start it.

        Raises:
            PgClusterError: initdb or the start failed (the server log is in the message).
        """
        root = Path(tempfile.mkdtemp(prefix="onceonly-chaos-pg-"))
        cluster = cls(bindir, root, _free_port())
        atexit.register(cluster.close)
        try:
            if cluster._owner is not None:
                os.chown(root, cluster._owner.pw_uid, cluster._owner.pw_gid)
            cluster._run(
                "initdb",
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-locale",
                "--encoding=UTF8",
                "--no-sync",
            )
            conf = [f"port = {cluster.port}", f"unix_socket_directories = '{root}'"]
            conf += [f"{name} = {value}" for name, value in SETTINGS.items()]
            cluster._append_conf("\n".join(conf) + "\n")
            cluster._start_watchdog()
            cluster.start()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def _start_watchdog(self) -> None:
        """A detached shell that stops the server and removes it once this process is
        gone, even SIGKILLed (then no atexit handler runs)."""
        pg_ctl = os.path.join(self.bindir, "pg_ctl")
        stop = shlex.join([*self._as_user, pg_ctl, "-D", str(self.data), "-m", "immediate", "stop"])
        script = (
            f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done;"
            f" {stop} >/dev/null 2>&1; rm -rf {shlex.quote(str(self.root))}"
        )
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def start(self) -> None:
        """Start the server and wait until it accepts connections."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t",
            str(START_TIMEOUT), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (``mode``: smart, fast or immediate)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def restart(self) -> None:
        """Crash the server (``-m immediate``) and start it again; waits until it is up."""
        self.stop("immediate")
        self.start()
        self.restarts += 1

    def running(self) -> bool:
        """Whether ``pg_ctl status`` sees a server."""
        cmd = [*self._as_user, os.path.join(self.bindir, "pg_ctl"), "-D", str(self.data), "status"]
        return subprocess.run(cmd, capture_output=True, cwd=self.root, check=False).returncode == 0

    def close(self) -> None:
        """Stop the server (immediately) and delete its directory; safe to repeat."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.kill()
            self._watchdog.wait()
        with contextlib.suppress(Exception):
            if self.data.exists() and self.running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- helpers
    def _append_conf(self, text: str) -> None:
        conf = self.data / "postgresql.conf"
        with open(conf, "a", encoding="utf-8") as f:
            f.write(text)

    def _run(self, program: str, *args: str) -> None:
        cmd = [*self._as_user, os.path.join(self.bindir, program), *args]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=self.root, check=False, timeout=120
        )
        if proc.returncode != 0:
            log = ""
            with contextlib.suppress(OSError):
                log = self.log_path.read_text(errors="replace")[-2000:]
            raise PgClusterError(
                f"{program} {' '.join(args)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}\n{log}"
            )
