# SPDX-License-Identifier: MIT
"""A database that does not exist or a login the server refuses is
:class:`~onceonly.StoreMisconfigured` (a ConfigurationError: no retry fixes it), while a
server that cannot be reached now stays a plain, transient StoreUnavailable. Consumers
still wait for the fix without counting an attempt. And ``sqlite:///x.db?mode=rw`` opens
an existing file only. Real PostgreSQL and MariaDB servers."""

from __future__ import annotations

import socket
import urllib.parse
from pathlib import Path

import pytest

import onceonly
from onceonly._core.settle import Action, Backoff, Stage, verdict
from tests.conftest import MYSQL_URL, PG_URL, require_mysql, require_postgres


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _with(url: str, *, user: str | None = None, database: str | None = None) -> str:
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        netloc = f"{user}@{netloc.rsplit('@', 1)[-1]}"
    path = parts.path if database is None else f"/{database}"
    return urllib.parse.urlunsplit((parts.scheme, netloc, path, parts.query, ""))


MISCONFIGURED = {
    "pg-no-database": (PG_URL, {"database": "onceonly_no_such_db"}),
    "pg-unknown-role": (PG_URL, {"user": "onceonly_no_such_role"}),
    "mysql-no-database": (MYSQL_URL, {"database": "onceonly_no_such_db"}),
    "mysql-access-denied": (MYSQL_URL, {"user": "onceonly_nobody:wrong"}),
}
UNREACHABLE = {
    "pg-refused": f"postgresql://postgres@127.0.0.1:{_free_port()}/test",
    "mysql-refused": f"mysql://root@127.0.0.1:{_free_port()}/test",
}


def _require(url: str) -> None:
    (require_postgres if url.startswith("postgresql") else require_mysql)()


@pytest.mark.parametrize("case", sorted(MISCONFIGURED))
def test_refused_configuration_is_store_misconfigured(case: str) -> None:
    """No such database / login refused: StoreMisconfigured, a ConfigurationError."""
    base, change = MISCONFIGURED[case]
    _require(base)
    store = onceonly.open_store(_with(base, **change), connect_timeout=2)
    try:
        with pytest.raises(onceonly.StoreMisconfigured) as caught:
            store.schema_version()
    finally:
        store.close()
    assert isinstance(caught.value, onceonly.ConfigurationError)
    assert isinstance(caught.value, onceonly.StoreUnavailable)  # consumers: uncounted wait
    assert str(caught.value).startswith("cannot connect to")


@pytest.mark.parametrize("case", sorted(MISCONFIGURED))
async def test_async_refused_configuration_is_store_misconfigured(case: str) -> None:
    """The async stores answer the same."""
    base, change = MISCONFIGURED[case]
    _require(base)
    store = onceonly.open_async_store(_with(base, **change), connect_timeout=2)
    try:
        with pytest.raises(onceonly.StoreMisconfigured):
            await store.schema_version()
    finally:
        await store.close()


@pytest.mark.parametrize("case", sorted(UNREACHABLE))
def test_unreachable_stays_transient(case: str) -> None:
    """Connection refused is a StoreUnavailable and not a configuration error."""
    store = onceonly.open_store(UNREACHABLE[case], connect_timeout=2)
    try:
        with pytest.raises(onceonly.StoreUnavailable) as caught:
            store.schema_version()
    finally:
        store.close()
    assert not isinstance(caught.value, onceonly.ConfigurationError)


def test_consumers_wait_for_a_misconfigured_store_without_counting() -> None:
    """The settle table treats it as an outage: RETRY, uncounted, never dead-lettered."""
    decided = verdict(
        onceonly.StoreMisconfigured("no such database"),
        stage=Stage.INBOX,
        delivery_count=5,
        max_deliveries=5,
        backoff=Backoff(),
        jitter=0.0,
    )
    assert (decided.action, decided.counted) == (Action.RETRY, False)


def test_sqlite_mode_rw_refuses_a_missing_file(tmp_path: Path) -> None:
    """?mode=rw: a missing file is a ConfigurationError naming it, and none is created."""
    db = tmp_path / "typo.db"
    with pytest.raises(onceonly.ConfigurationError, match="no SQLite database at") as caught:
        onceonly.open_store(f"sqlite:///{db}?mode=rw")
    assert str(db) in str(caught.value)
    assert not db.exists()


def test_sqlite_default_and_mode_rwc_create_the_file(tmp_path: Path) -> None:
    """The default (and mode=rwc) still creates the file: open_store + migrate() works."""
    for name, suffix in (("a.db", ""), ("b.db", "?mode=rwc")):
        store = onceonly.open_store(f"sqlite:///{tmp_path / name}{suffix}", migrate=True)
        store.close()
        assert (tmp_path / name).exists()
    store = onceonly.open_store(f"sqlite:///{tmp_path / 'a.db'}?mode=rw")
    assert store.schema_version() is not None
    store.close()


def test_sqlite_unknown_mode_is_refused(tmp_path: Path) -> None:
    """Only rw and rwc are modes."""
    with pytest.raises(onceonly.ConfigurationError, match="mode"):
        onceonly.open_store(f"sqlite:///{tmp_path / 'x.db'}?mode=ro")
