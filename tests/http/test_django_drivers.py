# SPDX-License-Identifier: MIT
"""Django's ``atomic()`` joined on either PostgreSQL driver, and on SQLite: the atomic
view's row commits with the stored response, a 500 rolls it back, and no extra query
opens the transaction.

Django picks its PostgreSQL driver by what imports: psycopg 3 if it can, else psycopg2.
Each case runs in a process of its own (Django is configured once per process); for
psycopg2, ``psycopg`` is hidden while Django's backend loads (the store still uses
psycopg 3 for its own connections). Django's test ``Client`` calls the middleware
directly, without a server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PG_URL, drop_pg_table, require_postgres, unique_table
from tests.http.servers import ROOT

SCRIPT = """
import json, sys
if sys.argv[1] == "psycopg2":
    sys.modules["psycopg"] = None  # Django's backend falls back to psycopg2
    from django.db.backends.postgresql import base, psycopg_any
    assert not psycopg_any.is_psycopg3 and base.Database.__name__ == "psycopg2"
    del sys.modules["psycopg"]

from django.db import connection
from django.test import Client

import tests.http.apps.django_site as site

def orders():
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {site.ORDERS}")
        return cursor.fetchone()[0]

client = Client()
headers = {"Idempotency-Key": "k1", "X-User": "alice"}
queries = []

def record(execute, sql, params, many, context):
    queries.append(sql)
    return execute(sql, params, many, context)

with connection.execute_wrapper(record):  # the statements sent through Django's cursors
    first = client.post("/atomic", {"item": "a"}, content_type="application/json", headers=headers)
again = client.post("/atomic", {"item": "a"}, content_type="application/json", headers=headers)
failed = client.post(
    "/atomic", {"item": "x", "status": 500}, content_type="application/json",
    headers={**headers, "Idempotency-Key": "k5"},
)
print(json.dumps({
    "driver": type(connection.connection).__module__,
    "statuses": [first.status_code, again.status_code, failed.status_code],
    "replayed": again.headers.get("idempotent-replayed"),
    "orders": orders(),
    "queries": queries,
}))
"""


@pytest.fixture(params=["sqlite", "psycopg", "psycopg2"])
def env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    effects = tmp_path / "effects"
    effects.touch()
    table = unique_table()
    base = {"ONCEONLY_TABLE": table, "EFFECTS": str(effects)}
    if request.param == "sqlite":
        yield "sqlite", {**base, "ONCEONLY_URL": f"sqlite:///{tmp_path / 'dj.db'}"}
        return
    require_postgres()
    import psycopg

    schema = f"dj_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    yield request.param, {**base, "ONCEONLY_URL": PG_URL, "DJANGO_SCHEMA": schema}
    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")
    drop_pg_table(table)
    drop_pg_table(f"{table}_outbox")


def test_atomic_view_joins_django_transaction(env: tuple[str, dict[str, str]]) -> None:
    driver, variables = env
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, driver],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **variables, "PYTHONPATH": str(ROOT)},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    expected = {"sqlite": "sqlite3", "psycopg": "psycopg", "psycopg2": "psycopg2.extensions"}
    assert out["driver"] == expected[driver]
    assert out["statuses"] == [201, 201, 500]
    assert out["replayed"] == "true"
    assert out["orders"] == 1  # the first request's row; the 500's was rolled back
    # the claim joined Django's transaction as atomic() left it: nothing but Django's own
    # BEGIN (SQLite) went through Django's cursors before the view's INSERT
    queries = [q for q in out["queries"] if q.upper() != "BEGIN"]
    assert queries and queries[0].upper().startswith("INSERT INTO"), out["queries"]
