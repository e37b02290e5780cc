# SPDX-License-Identifier: MIT
"""Bad input gets a typed error and loses nothing already committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import onceonly


@pytest.mark.parametrize(
    "key",
    [None, 42, b"bytes", "", "x" * 256, "line\nbreak", "nul\x00", "del\x7f", "c1\x85"],
)
def test_invalid_keys_store_nothing(store: Any, key: Any) -> None:
    """An invalid key raises InvalidKey before the store is touched."""
    inbox = onceonly.Inbox(store, consumer="c")
    ran: list[int] = []
    with pytest.raises(onceonly.InvalidKey):
        inbox.process(key, {}, lambda p, tx: ran.append(1))
    assert ran == []
    assert inbox.process("ok", {}, lambda p, tx: 1).result == 1


def test_longest_valid_key(store: Any) -> None:
    """A 255-character key (non-ASCII too) works."""
    inbox = onceonly.Inbox(store, consumer="c")
    key = "é" * 255
    assert inbox.process(key, {}, lambda p, tx: "x").result == "x"
    assert inbox.process(key, {}, lambda p, tx: "y").replayed


def test_unfingerprintable_payload_is_typed(store: Any) -> None:
    """A payload without a canonical form raises EncodingError naming fingerprint=."""
    inbox = onceonly.Inbox(store, consumer="c")
    with pytest.raises(onceonly.EncodingError, match="fingerprint="):
        inbox.process("k", object(), lambda p, tx: None)
    custom = onceonly.Inbox(store, consumer="c2", fingerprint=lambda p: "fixed")
    assert custom.process("k", object(), lambda p, tx: 1).result == 1


def test_failed_result_encoding_keeps_committed_result(store: Any) -> None:
    """A later bad delivery cannot damage a completed record."""
    inbox = onceonly.Inbox(store, consumer="c")
    inbox.process("k", {"a": 1}, lambda p, tx: "first")
    with pytest.raises(onceonly.PayloadMismatch):
        inbox.process("k", {"a": 2}, lambda p, tx: object())
    assert inbox.process("k", {"a": 1}, lambda p, tx: "other").result == "first"


def test_unknown_state_in_table_is_corrupt(sql_store: Any) -> None:
    """A row with a state onceonly does not know raises CorruptRecord and is left alone."""
    inbox = onceonly.Inbox(sql_store, consumer="c")
    inbox.process("k", {}, lambda p, tx: 1)
    mysql = getattr(sql_store, "dialect", None) == "mysql"
    key = "`key`" if mysql else "key"  # a reserved word on MariaDB/MySQL
    with sql_store.session() as s:
        if sql_store.url.startswith("postgres") or mysql:  # a newer version's state, say
            s.execute(
                f"ALTER TABLE {sql_store.table} DROP CONSTRAINT {sql_store.table}_state_check"
            )
        s.execute(f"UPDATE {sql_store.table} SET state = 'paused' WHERE {key} = ?", ("k",))
    with pytest.raises(onceonly.CorruptRecord):
        inbox.process("k", {}, lambda p, tx: 2)
    with sql_store.session() as s:
        row = s.execute(f"SELECT state FROM {sql_store.table} WHERE {key} = ?", ("k",)).fetchone()
    assert row[0] == "paused"


@pytest.mark.parametrize(
    "url",
    ["nonsense", "ftp://x", "sqlite://host/x.db", "sqlite:///", "sqlite:///x.db?bogus=1"],
)
def test_bad_urls(url: str) -> None:
    """Malformed or unknown store URLs raise ConfigurationError."""
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.open_store(url)


@pytest.mark.parametrize("table", ["bad-name", "x; DROP TABLE y", "1abc", "a" * 64])
def test_bad_table_names(tmp_path: Path, table: str) -> None:
    """Table names are validated identifiers."""
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.open_store(f"sqlite:///{tmp_path / 'x.db'}", table=table)


def test_bad_options(store: Any) -> None:
    """Non-positive waits, ttls and attempt limits are rejected up front."""
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.Inbox(store, consumer="c", max_attempts=0)
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.Inbox(store, consumer="c", ttl=-1)
    with pytest.raises(onceonly.ConfigurationError):
        onceonly.Inbox(store, consumer="c", wait=-1)
    with pytest.raises(onceonly.InvalidKey):
        onceonly.Inbox(store, consumer="")


def test_store_gone_midway_is_store_error(tmp_path: Path) -> None:
    """A database file that becomes unusable raises a StoreError, not a driver error."""
    path = tmp_path / "gone.db"
    store = onceonly.open_store(f"sqlite:///{path}")
    try:
        store.migrate()
        inbox = onceonly.Inbox(store, consumer="c")
        inbox.process("k1", {}, lambda p, tx: 1)
        with store.session() as s:
            s.execute(f"DROP TABLE {store.table}")
        with pytest.raises(onceonly.StoreError):
            inbox.process("k2", {}, lambda p, tx: 2)
    finally:  # Python 3.13 warns about sqlite3 connections left to the garbage collector
        store.close()
