# SPDX-License-Identifier: MIT
"""The Django app config: reads ``settings.ONCEONLY_HTTP`` and opens the store once."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import quote

from django.apps import AppConfig
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

import onceonly
from onceonly.errors import ConfigurationError
from onceonly.types import Store

__all__ = ["OnceOnlyConfig", "options", "store_url"]

DEFAULT_TABLE = "onceonly_records"


def options() -> dict[str, Any]:
    """``settings.ONCEONLY_HTTP`` (an empty dict when unset)."""
    value = getattr(settings, "ONCEONLY_HTTP", {})
    if not isinstance(value, dict):
        raise ConfigurationError("settings.ONCEONLY_HTTP must be a dict")
    return value


def store_url() -> str:
    """The store URL: ``STORE_URL``, else the default database's."""
    url = options().get("STORE_URL")
    if url:
        return str(url)
    db = connections[DEFAULT_DB_ALIAS].settings_dict
    engine = str(db["ENGINE"])
    if engine.endswith("sqlite3"):
        return f"sqlite:///{db['NAME']}"
    if engine.endswith("postgresql"):
        user = quote(str(db.get("USER") or ""), safe="")
        if user and db.get("PASSWORD"):
            user += ":" + quote(str(db["PASSWORD"]), safe="")
        host = str(db.get("HOST") or "")
        if db.get("PORT"):
            host += f":{db['PORT']}"
        name = quote(str(db.get("NAME") or ""), safe="")
        return f"postgresql://{user + '@' if user else ''}{host}/{name}"
    raise ConfigurationError(
        f"onceonly has no store for the database engine {engine}; set ONCEONLY_HTTP['STORE_URL']"
    )


class OnceOnlyConfig(AppConfig):
    """``onceonly.contrib.django``: the records table and the store."""

    name = "onceonly.contrib.django"
    label = "onceonly"
    verbose_name = "onceonly"
    default = True

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        self._store: Store | None = None
        self._lock = threading.Lock()

    def store(self) -> Store:
        """The store of the HTTP middleware (opened on first use)."""
        with self._lock:
            if self._store is None:
                table = options().get("TABLE", DEFAULT_TABLE)
                self._store = onceonly.open_store(store_url(), table=table)
            return self._store
