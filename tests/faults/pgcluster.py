# SPDX-License-Identifier: MIT
"""A private, throw-away PostgreSQL cluster for fault tests.

The shared server on 5432 must never be stopped or restarted: other suites run against
it at the same time. Fault tests start their own cluster instead (``initdb`` into a
temporary directory, ``pg_ctl start`` on a free port with its socket in that directory)
and may then restart it, crash it or kill its backends freely::

    cluster = PgCluster()
    cluster.start()
    url = cluster.url()                  # postgresql://postgres@127.0.0.1:<port>/postgres
    cluster.terminate_backends(application_name="relay")
    cluster.restart(mode="immediate")    # a crash and recovery, same port and data
    cluster.stop()                       # stops it and deletes its directory

The first cluster of a process runs ``initdb`` once into a template that later clusters
copy (removed at exit). PostgreSQL refuses to run as root, so under root the server
binaries run as the ``postgres`` user (``runuser``) and the directories are handed to
that user. The binaries are found through ``ONCEONLY_PG_BINDIR``, then ``PATH``, then
the newest ``/usr/lib/postgresql/*/bin`` (Debian's layout). :class:`Unavailable` says
what is missing when a cluster cannot be had.

This module imports no test framework, so helper processes may use it too.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["PgCluster", "Unavailable", "find_bindir"]

_RUN_AS = "postgres"  # the user the server runs as when we are root


class Unavailable(RuntimeError):
    """No private cluster can be started here (no server binaries, no user to run as)."""


def find_bindir() -> Path:
    """The directory of ``initdb``, ``pg_ctl`` and ``postgres``.

    Raises:
        Unavailable: no PostgreSQL server binaries were found.
    """
    candidates: list[str] = []
    if os.environ.get("ONCEONLY_PG_BINDIR"):
        candidates.append(os.environ["ONCEONLY_PG_BINDIR"])
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    for directory in candidates:
        if all((Path(directory) / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return Path(directory)
    raise Unavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl, postgres): install the server "
        "package or set ONCEONLY_PG_BINDIR"
    )


#: One initdb'd data directory per set of binaries, copied for each cluster (initdb
#: takes about a second; a copy a tenth of that). Deleted when the process exits.
_templates: dict[Path, Path] = {}


def _remove_templates() -> None:
    for root in _templates.values():
        shutil.rmtree(root.parent, ignore_errors=True)
    _templates.clear()


atexit.register(_remove_templates)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PgCluster:
    """One private PostgreSQL cluster (see the module docstring).

    Args:
        port: the TCP port (default: a free one, chosen at the first start).
        settings: extra server settings (``-c name=value``), e.g. ``{"max_connections": "50"}``.
        bindir: the server binaries (default: :func:`find_bindir`).

    The cluster listens on 127.0.0.1 only, trusts every local connection and runs with
    ``fsync=off``: a process crash (``restart(mode="immediate")``) loses nothing, and
    nothing here must survive a machine crash.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        settings: dict[str, str] | None = None,
        bindir: Path | None = None,
    ) -> None:
        self.bindir = bindir or find_bindir()
        self.port = port
        self.settings = {"fsync": "off", "max_connections": "100", **(settings or {})}
        self.root: Path | None = None
        self._as_root = os.geteuid() == 0

    # -- paths and processes
    @property
    def datadir(self) -> Path:
        assert self.root is not None, "the cluster has not been created"
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        assert self.root is not None, "the cluster has not been created"
        return self.root / "server.log"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bindir / tool), *args]
        if self._as_root:
            cmd = ["runuser", "-u", _RUN_AS, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{tool} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                f"\n{self.log_tail()}"
            )
        return done

    def log_tail(self, lines: int = 30) -> str:
        """The end of the server log (for failure messages)."""
        if self.root is None or not self.logfile.exists():
            return ""
        text = self.logfile.read_text(errors="replace").splitlines()[-lines:]
        return "server log:\n" + "\n".join(text)

    def _owner(self) -> tuple[int, int] | None:
        """The uid and gid the server runs as when we are root (else None)."""
        if not self._as_root:
            return None
        if shutil.which("runuser") is None:
            raise Unavailable("running as root needs runuser to start PostgreSQL")
        try:
            import pwd

            entry = pwd.getpwnam(_RUN_AS)
        except KeyError as exc:
            raise Unavailable(f"running as root needs a {_RUN_AS!r} user") from exc
        return entry.pw_uid, entry.pw_gid

    def _mkdtemp(self) -> Path:
        root = Path(tempfile.mkdtemp(prefix="onceonly-pg-"))
        owner = self._owner()
        if owner is not None:
            os.chown(root, *owner)
        return root

    def _template(self) -> Path:
        """A fresh cluster's data directory, made once per process."""
        template = _templates.get(self.bindir)
        if template is None or not template.exists():
            template = self._mkdtemp() / "data"
            self._run(
                "initdb",
                "-D",
                str(template),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            )
            _templates[self.bindir] = template
        return template

    def _create(self) -> None:
        template = self._template()
        self.root = self._mkdtemp()
        cmd = ["cp", "-a", str(template), str(self.datadir)]
        if self._as_root:
            cmd = ["runuser", "-u", _RUN_AS, "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def _options(self) -> str:
        assert self.port is not None
        settings = {"listen_addresses": "127.0.0.1", **self.settings}
        flags = [f"-p {self.port}", f"-k {self.root}"]
        flags += [f"-c {name}={value}" for name, value in settings.items()]
        return " ".join(flags)

    # -- the public operations
    def start(self) -> None:
        """Create the cluster on first use, then start it and wait until it accepts
        connections."""
        if self.root is None:
            self._create()
        for attempt in range(3):
            if self.port is None or attempt:
                self.port = _free_port()  # a fresh port if the last one was taken
            done = self._run(
                "pg_ctl",
                "start",
                "-D",
                str(self.datadir),
                "-l",
                str(self.logfile),
                "-o",
                self._options(),
                "-w",
                "-t",
                "30",
                check=False,
            )
            if done.returncode == 0:
                self.wait_ready()
                return
            if "already in use" not in self.log_tail(5):
                break
        raise RuntimeError(f"pg_ctl start failed: {done.stderr.strip()}\n{self.log_tail()}")

    def stop(self, mode: str = "fast", *, remove: bool = True) -> None:
        """Stop the server (``smart``, ``fast`` or ``immediate``); by default also delete
        its directory (the cluster can be started again: it is created anew)."""
        if self.root is None:
            return
        if self.running():
            self._run("pg_ctl", "stop", "-D", str(self.datadir), "-m", mode, "-w", "-t", "30")
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None

    def restart(self, mode: str = "immediate", *, down_for: float = 0.0) -> None:
        """Stop the server in ``mode`` (``immediate``: a crash, recovered at start), stay
        down ``down_for`` seconds, and start it again on the same port and data."""
        self.stop(mode, remove=False)
        if down_for > 0:
            time.sleep(down_for)
        self.start()

    def running(self) -> bool:
        """Whether the server process is up."""
        if self.root is None or not (self.datadir / "postmaster.pid").exists():
            return False
        return self._run("pg_ctl", "status", "-D", str(self.datadir), check=False).returncode == 0

    def url(self, dbname: str = "postgres", **params: str) -> str:
        """A ``postgresql://`` URL of the cluster (``params``: query options such as
        ``application_name``)."""
        assert self.port is not None, "start the cluster first"
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}" + (
            f"?{query}" if query else ""
        )

    def connect(self, **kwargs: Any) -> Any:
        """An autocommit psycopg connection as the superuser."""
        import psycopg

        return psycopg.connect(self.url(), autocommit=True, connect_timeout=5, **kwargs)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait until a connection succeeds (recovery after a crash may take a moment)."""
        import psycopg

        deadline = time.monotonic() + timeout
        while True:
            try:
                with self.connect():
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def terminate_backends(self, application_name: str | None = None) -> int:
        """``pg_terminate_backend`` every client backend but our own (or only those of
        ``application_name``); returns how many were terminated."""
        query = (
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
        )
        params: tuple[str, ...] = ()
        if application_name is not None:
            query += " AND application_name = %s"
            params = (application_name,)
        with self.connect() as conn:
            row = conn.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def backends(self, application_name: str | None = None) -> int:
        """How many client backends (of ``application_name``) are connected."""
        query = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
        params: tuple[str, ...] = ()
        if application_name is not None:
            query += " AND application_name = %s"
            params = (application_name,)
        with self.connect() as conn:
            row = conn.execute(query, params).fetchone()
        return int(row[0]) if row else 0

    def __enter__(self) -> PgCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
