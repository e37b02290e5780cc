# SPDX-License-Identifier: MIT
"""The dashboard's records list on a PostgreSQL table of 1,000,000 records: the time of
its first page under the filters an operator uses, and each query's plan.

    python bench/dashboard_records.py [--rows 1000000] [--runs 15] [--keep]

Seeds ``bench_dashboard_records`` with one ``INSERT … SELECT generate_series`` (ten
scopes; 96 % completed, 2 % failed, 1 % dead, 1 % in progress; a third of the errors
mention a timeout), ANALYZEs it, then times ``GET /api/records?…`` and ``GET /records?…``
(the HTML page) through the ASGI app in process (no network), median and worst of
``--runs`` after one warm-up, and prints ``EXPLAIN (ANALYZE, BUFFERS)`` of the scan
behind each. Not a test: nothing here passes or fails.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
import psycopg

import onceonly
from onceonly._core.admin_sql import query_predicate
from onceonly._core.sql import qmark_to_format
from onceonly.dashboard import _views
from onceonly.dashboard import app as dashboard_app
from onceonly.stores.postgres._sql import _RETURNING

URL = "postgresql://postgres@127.0.0.1:5432/postgres"
TABLE = "bench_dashboard_records"

# name -> the query string an operator sends
FILTERS: dict[str, dict[str, str]] = {
    "no filter": {},
    "scope": {"scope": "scope-7"},
    "state=dead": {"state": "dead"},
    "scope + state=dead": {"scope": "scope-7", "state": "dead"},
    "scope + state=failed + error 'timeout'": {
        "scope": "scope-7", "state": "failed", "q": "timeout",
    },
    "state=in_progress + age 1h": {"state": "in_progress", "age": "1h"},
    "scope + key prefix": {"scope": "scope-7", "key": "order-00042"},
    "page 2 of scope + state=dead": {"scope": "scope-7", "state": "dead", "after": "NEXT"},
    "deep page: scope after 90 % of its keys": {"scope": "scope-7", "after": "DEEP"},
    "worst: state=dead + error matching none": {"state": "dead", "q": "no such text"},
}  # fmt: skip


def seed(rows: int) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
    store = onceonly.open_store(URL, table=TABLE, outbox_table=None)
    store.migrate()
    store.close()
    started = time.perf_counter()
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(
            f"""
            INSERT INTO {TABLE} (scope, key, state, fingerprint, token, attempts, lease_until,
                                 result, error, payload, created_at, updated_at,
                                 completed_at, expires_at)
            SELECT 'scope-' || (i / 100 % 10),  -- independent of the state (i % 100)
                   'order-' || lpad(i::text, 8, '0'),
                   s.state,
                   'v1:' || md5(i::text),
                   i,
                   CASE s.state WHEN 'dead' THEN 5 WHEN 'failed' THEN 2 ELSE 0 END,
                   CASE WHEN s.state = 'in_progress' THEN now() - interval '10 minutes' END,
                   CASE WHEN s.state = 'completed' THEN '{{"ok":true}}' END,
                   CASE WHEN s.state IN ('failed', 'dead') THEN
                        CASE i % 3 WHEN 0 THEN 'TimeoutError: bank did not answer'
                                   WHEN 1 THEN 'CardDeclined: insufficient funds'
                                   ELSE 'ValueError: bad amount' END END,
                   CASE WHEN s.state IN ('failed', 'dead') THEN '{{"amount":' || i || '}}' END,
                   now() - make_interval(secs => (i % 86400)),
                   now() - make_interval(secs => (i % 86400)),
                   CASE WHEN s.state = 'completed' THEN now() - make_interval(secs => (i % 86400))
                   END,
                   CASE WHEN s.state = 'completed' THEN now() + interval '7 days' END
            FROM generate_series(1, {rows}) AS i,
                 LATERAL (SELECT CASE WHEN i % 100 < 96 THEN 'completed'
                                      WHEN i % 100 < 98 THEN 'failed'
                                      WHEN i % 100 < 99 THEN 'dead'
                                      ELSE 'in_progress' END AS state) AS s
            """
        )
        conn.execute(f"VACUUM ANALYZE {TABLE}")
    print(f"seeded {rows:,} records in {time.perf_counter() - started:.1f} s")


def explain(params: dict[str, str], limit: int) -> str:
    """The plan of the scan behind the first page of ``params``."""
    filters = _views.Filters.parse(params)
    query = filters.query(limit=limit + 1)
    with psycopg.connect(URL, autocommit=True) as conn:
        now, older = conn.execute(
            "SELECT clock_timestamp(), clock_timestamp() - make_interval(secs => %s)",
            [float(query.older_than or 0.0)],
        ).fetchone() or (None, None)
        where, args = query_predicate(query, now, older)
        sql = (
            f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT {_RETURNING} FROM {TABLE} AS r"
            f" WHERE {where} ORDER BY scope, key LIMIT ?"
        )
        rows = conn.execute(qmark_to_format(sql).encode(), [*args, query.limit]).fetchall()
    return "\n".join("    " + r[0] for r in rows)


async def measure(rows: int, runs: int, limit: int, show_plans: bool) -> None:
    store = onceonly.open_async_store(URL, table=TABLE, outbox_table=None)
    asgi = dashboard_app(store, page_size=limit, outbox=False)
    results = []
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=asgi), base_url="http://bench"
    ) as client:
        for name, params in FILTERS.items():
            params = dict(params)
            if params.get("after") == "DEEP":
                params["after"] = _views.encode_cursor(("scope-7", f"order-{rows * 9 // 10:08d}"))
            if params.get("after") == "NEXT":
                first = {k: v for k, v in params.items() if k != "after"}
                page = (await client.get("/api/records", params=first)).json()
                params["after"] = page["next"]
            timings: dict[str, list[float]] = {"api": [], "html": []}
            for path, kind in (("/api/records", "api"), ("/records", "html")):
                await client.get(path, params=params)  # warm-up
                for _ in range(runs):
                    t0 = time.perf_counter()
                    response = await client.get(path, params=params)
                    timings[kind].append((time.perf_counter() - t0) * 1000)
                    assert response.status_code == 200, response.text
            found = len((await client.get("/api/records", params=params)).json()["records"])
            results.append((name, found, timings))
            if show_plans:
                print(f"\n{name}: {params}\n{explain(params, limit)}")
    await store.close()
    print(f"\nfirst page ({limit} records) of {TABLE}, {runs} runs, milliseconds")
    head = ("filter", "rows", "api p50", "api max", "html p50", "html max")
    print("{:<42} {:>5} {:>8} {:>8} {:>9} {:>9}".format(*head))
    for name, found, t in results:
        print(
            f"{name:<42} {found:>5} {statistics.median(t['api']):>8.1f} {max(t['api']):>8.1f}"
            f" {statistics.median(t['html']):>9.1f} {max(t['html']):>9.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--reuse", action="store_true", help="keep the seeded table")
    parser.add_argument("--keep", action="store_true", help="do not drop the table at the end")
    parser.add_argument("--no-plans", action="store_true")
    parser.add_argument(
        "--operator-index",
        action="store_true",
        help="first create the partial index on (scope, key) of records not completed",
    )
    args = parser.parse_args()
    if not args.reuse:
        seed(args.rows)
    with psycopg.connect(URL, autocommit=True) as conn:
        if args.operator_index:
            conn.execute(
                f"CREATE INDEX IF NOT EXISTS {TABLE}_open ON {TABLE} (scope, key)"
                " WHERE state <> 'completed'"
            )
        else:
            conn.execute(f"DROP INDEX IF EXISTS {TABLE}_open")
        conn.execute(f"ANALYZE {TABLE}")
    asyncio.run(measure(args.rows, args.runs, args.limit, not args.no_plans))
    if not args.keep:
        with psycopg.connect(URL, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


if __name__ == "__main__":
    main()
