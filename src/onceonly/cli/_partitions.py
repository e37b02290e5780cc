# SPDX-License-Identifier: MIT
"""``onceonly records partitions``: list, create ahead and drop the partitions of a
time-partitioned PostgreSQL records table (``onceonly migrate --partitioned``)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from onceonly.admin import Admin


def configure_partitions(sub: Any, url_options: Any, duration: Any, seconds: Any) -> None:
    """Add the ``partitions`` action to the ``records`` sub-parsers ``sub``."""
    parts = sub.add_parser(
        "partitions",
        help="list, create ahead or drop the partitions of a partitioned table (PostgreSQL)",
        description="Without --ensure or --drop-expired: list the partitions. --ensure"
        " creates the current period's partition and --ahead more; --drop-expired drops"
        " partitions whose period is over and whose records have all expired, after moving"
        " what retention keeps (in progress, failed, dead) to the DEFAULT partition. Run"
        " both from cron, e.g. hourly.",
    )
    url_options(parts)
    parts.add_argument("--ensure", action="store_true", help="create partitions ahead")
    parts.add_argument(
        "--drop-expired", action="store_true", help="drop partitions whose records all expired"
    )
    parts.add_argument(
        "--ahead", type=int, default=3, help="with --ensure: periods ahead to create (default: 3)"
    )
    parts.add_argument(
        "--period",
        type=duration,
        default=None,
        help="with --ensure: the length of a partition, e.g. 1d or 1h (default: the newest"
        " partition's)",
    )
    parts.add_argument(
        "--older-than",
        type=duration,
        default=0.0,
        help="with --drop-expired: only partitions whose records expired this long ago",
    )
    parts.add_argument(
        "--include-dead",
        action="store_true",
        help="with --drop-expired: drop failed and dead records with their partition",
    )
    parts.add_argument(
        "--lock-wait",
        type=seconds,
        default=2.0,
        help="with --drop-expired: seconds to wait for the table lock before skipping a"
        " partition (default: 2)",
    )
    parts.add_argument("--dry-run", action="store_true", help="say what would be dropped")


def run_partitions(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    """Run ``onceonly records partitions``; returns the exit status."""
    from onceonly.cli._main import CommandError
    from onceonly.cli._store import postgres_store

    store = postgres_store(admin.store)
    if store is None:
        raise CommandError("partitions exist only on PostgreSQL stores")
    partitions = store.partitions
    if args.ensure:
        period = None if args.period is None else timedelta(seconds=args.period)
        created = partitions.ensure(period=period, ahead=args.ahead)
        out.write(f"created {len(created)} partitions\n")
        for name in created:
            out.write(f"  {name}\n")
    if args.drop_expired:
        report = partitions.drop_expired(
            older_than=args.older_than,
            include_dead=args.include_dead,
            dry_run=args.dry_run,
            lock_wait=args.lock_wait,
        )
        verb = "would drop" if args.dry_run else "dropped"
        out.write(f"{verb} {len(report.dropped)} partitions, moved {report.moved} records\n")
        for name in report.dropped:
            out.write(f"  {name}\n")
        for name, latest in report.waiting:
            out.write(f"waiting: {name} (a record expires at {latest.isoformat()})\n")
        for name in report.busy:
            out.write(f"busy: {name} (locked longer than --lock-wait; try again)\n")
    if not (args.ensure or args.drop_expired):
        for part in partitions.all():
            span = (
                "DEFAULT"
                if part.start is None or part.end is None
                else f"{part.start.isoformat()} .. {part.end.isoformat()}"
            )
            rows = "?" if part.rows < 0 else str(part.rows)
            out.write(f"{part.name}  {span}  ~{rows} rows\n")
    return 0
