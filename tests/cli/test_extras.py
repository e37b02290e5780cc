# SPDX-License-Identifier: MIT
"""Without its extra, every module that needs one says which to install.

Runs the package from source in a bare virtual environment (no pip, no packages), so
none of the drivers are importable there. Add a row to EXTRAS for a new module.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
import venv
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: module -> the extra it needs
EXTRAS = {
    "onceonly.stores.postgres": "postgres",
    "onceonly.stores.postgres._store_async": "postgres",
    "onceonly.stores.postgres._session": "postgres",
    "onceonly.stores.postgres._sql": "postgres",
    "onceonly.brokers.rabbitmq": "rabbitmq",
    "onceonly.brokers.nats": "nats",
    "onceonly.brokers.redis_streams": "redis",
    "onceonly.brokers.sqs": "sqs",
    "onceonly.dashboard": "dashboard",
}


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python with the standard library only (the project from source on PYTHONPATH)."""
    where = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(where)
    return where / "bin" / "python"


def run_bare(python: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = str(SRC)
    return subprocess.run(
        [str(python), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_bare_python_really_lacks_the_drivers(bare_python: Path) -> None:
    """The environment the other tests rely on has none of the optional drivers."""
    proc = run_bare(
        bare_python,
        """
        import importlib.util
        found = [m for m in ("psycopg", "aio_pika", "nats", "redis", "psycopg_pool")
                 if importlib.util.find_spec(m)]
        print(found)
        import onceonly  # the root imports no extra
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRAS.items()))
def test_import_error_names_the_extra(bare_python: Path, module: str, extra: str) -> None:
    """Importing the module raises an ImportError saying ``pip install 'onceonly[extra]'``."""
    proc = run_bare(
        bare_python,
        f"""
        try:
            import {module}
        except ImportError as exc:
            print("ImportError:", exc)
        else:
            print("imported")
        """,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ImportError:"), proc.stdout
    assert f"pip install 'onceonly[{extra}]'" in proc.stdout


def test_open_store_and_the_relay_cli_name_the_extra(bare_python: Path) -> None:
    """The entry points turn the missing extra into a ConfigurationError with the fix."""
    proc = run_bare(
        bare_python,
        """
        import onceonly
        from onceonly.cli._outbox import publisher_from_url
        for call in (lambda: onceonly.open_store("postgresql://u@h/db"),
                     lambda: publisher_from_url("amqp://guest@h/"),
                     lambda: publisher_from_url("nats://h:4222")):
            try:
                call()
            except onceonly.ConfigurationError as exc:
                print(exc)
        """,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 3
    for line, extra in zip(lines, ("postgres", "rabbitmq", "nats"), strict=True):
        assert f"pip install 'onceonly[{extra}]'" in line, line
