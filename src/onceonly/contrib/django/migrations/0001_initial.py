# SPDX-License-Identifier: MIT
"""Create onceonly's records table (the store's own ``migrate()``, run by Django).

Not atomic: the store migrates on a connection of its own, which must not wait for a
transaction of Django's migration holding the same database (SQLite's single writer).
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def create_records_table(apps: Any, schema_editor: Any) -> None:
    from onceonly.contrib.django.apps import DEFAULT_TABLE, options, store_url
    from onceonly.stores import open_store

    if schema_editor.connection.alias != "default":
        return
    store = open_store(store_url(), table=options().get("TABLE", DEFAULT_TABLE))
    try:
        store.migrate()
    finally:
        store.close()


class Migration(migrations.Migration):
    atomic = False
    initial = True
    dependencies = []  # noqa: RUF012
    operations = [  # noqa: RUF012
        migrations.RunPython(create_records_table, migrations.RunPython.noop)
    ]
