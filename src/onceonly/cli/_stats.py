# SPDX-License-Identifier: MIT
"""``onceonly stats``: per-scope counts by state, the oldest in-progress claim,
expired records not purged yet, and the table's size (spec §8)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from onceonly._core.state import State
from onceonly.admin import Admin, StatsReport
from onceonly.cli._records import parse_duration
from onceonly.types import Store

__all__ = ["configure_stats", "run_stats"]


def configure_stats(parser: argparse.ArgumentParser) -> None:
    """Add the ``stats`` options to ``parser``."""
    parser.add_argument("--url", required=True, help="the store URL (sqlite:///…, postgresql://…)")
    parser.add_argument("--table", help="the records table (default: onceonly_records)")
    parser.add_argument("--scope", help="only this scope")
    parser.add_argument(
        "--window",
        type=parse_duration,
        default=3600.0,
        help="the duplicate rate's window, e.g. 1h or 1d (default: 1h)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _outbox_counts(store: Store) -> dict[str, int] | None:
    """Pending and dead outbox rows (the relay's backlog), or None without an outbox."""
    if store.outbox_table is None:
        return None
    from onceonly.errors import StoreError
    from onceonly.outbox import Outbox

    try:
        return Outbox(store).counts()
    except StoreError:  # no outbox table in this database (NotMigrated)
        return None


def stats_json(report: StatsReport, outbox: dict[str, int] | None = None) -> dict[str, Any]:
    """The report as a JSON object."""
    return {
        "outbox": outbox,
        "scopes": {
            s.scope: {
                **{state.value: s.counts.get(state, 0) for state in State},
                "expired": s.expired,
                "oldest_in_progress_seconds": s.oldest_in_progress,
                "claims": s.claims,
                "replays": s.replays,
                "duplicate_rate": s.duplicate_rate,
            }
            for s in report.scopes
        },
        "sizes": report.sizes,
    }


def run_stats(args: argparse.Namespace) -> int:
    """Run ``onceonly stats``; returns the exit status."""
    from onceonly.cli._store import open_existing

    store = open_existing(args.url, args, **({"table": args.table} if args.table else {}))
    try:
        report = Admin(store).stats(scope=args.scope, window=args.window)
        outbox = _outbox_counts(store)
    finally:
        store.close()
    out = sys.stdout
    if args.json:
        out.write(json.dumps(stats_json(report, outbox)) + "\n")
        return 0
    states = [s.value for s in State]
    head = ["scope", *states, "expired", "oldest_in_progress", "claims", "duplicate_rate"]
    out.write("\t".join(head) + "\n")
    for s in report.scopes:
        oldest = "-" if s.oldest_in_progress is None else f"{s.oldest_in_progress:.0f}s"
        counts = [str(s.counts.get(State(v), 0)) for v in states]
        rate = "-" if s.duplicate_rate is None else f"{s.duplicate_rate:.1%}"
        row = [s.scope, *counts, str(s.expired), oldest, str(s.claims), rate]
        out.write("\t".join(row) + "\n")
    for part, size in report.sizes.items():
        out.write(f"{part} size: {size} bytes\n")
    if outbox is not None:
        out.write(f"outbox: {outbox['pending']} pending, {outbox['dead']} dead\n")
    return 0
