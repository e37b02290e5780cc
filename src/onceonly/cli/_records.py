# SPDX-License-Identifier: MIT
r"""``onceonly records``: retention, the reaper, inspection, redrive and delete (spec §8).

Exit statuses: 0 done; 1 nothing matched where something was named (``show``,
``redrive`` or ``delete`` of one record); 2 usage and configuration errors.

``list`` (and ``redrive --dry-run``) print tab-separated rows under a header line
(``--no-header`` drops it), in the fixed column order of :data:`LIST_COLUMNS`; values
are whole, with backslash, tab, newline and carriage return escaped as ``\\``,
``\t``, ``\n`` and ``\r`` so a row is always one line. ``--json`` prints one object
per line instead.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from onceonly._core.admin import Query, redrive_decision
from onceonly._core.state import Record, State
from onceonly.admin import Admin

__all__ = ["LIST_COLUMNS", "ProgressBar", "configure_records", "parse_duration", "run_records"]

#: The columns of ``records list``, in their order (new columns are only ever appended).
LIST_COLUMNS = ("scope", "key", "state", "attempts", "updated_at", "error")
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw]?)")


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``15m``, ``12h``, ``30d`` or ``2w`` as seconds (argparse type)."""
    m = _DURATION.fullmatch(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(
            f"invalid duration {text!r}: use a number with s, m, h, d or w (e.g. 30d)"
        )
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        n = -1.0
    if not n >= 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, not {text!r}")
    return n


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, not {text!r}")
    return n


class ProgressBar:
    """A one-line progress bar on a terminal's stderr (nothing when not a terminal).

    Args:
        total: the expected count (``None``: show the count only).
        label: what is counted.
        stream: where to draw (default ``sys.stderr``).
    """

    def __init__(self, total: int | None, label: str, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = self.stream.isatty()
        self.total = total
        self.label = label
        self.done = 0

    def __call__(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self.total:
            frac = min(1.0, self.done / self.total)
            bar = "#" * int(frac * 30)
            line = f"\r[{bar:<30}] {self.done}/{self.total} {self.label}"
        else:
            line = f"\r{self.done} {self.label}"
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        if self.enabled and self.done:
            self.stream.write("\n")


def _url_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the store URL (sqlite:///…, postgresql://…)")
    parser.add_argument("--table", help="the records table (default: onceonly_records)")


def _header_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--no-header",
        dest="header",
        action="store_false",
        help="print the rows without the header line (for scripts)",
    )


def configure_records(parser: argparse.ArgumentParser) -> None:
    """Add the ``records`` actions and their options to ``parser``."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)

    purge = sub.add_parser(
        "purge",
        help="delete expired records in batches",
        description="Delete completed records past their expiry in batches of --batch-size,"
        " one short transaction each, pausing between batches. Failed and dead records are"
        " kept unless --include-dead.",
    )
    _url_options(purge)
    purge.add_argument(
        "--older-than",
        type=parse_duration,
        default=0.0,
        help="only records expired (failed/dead: last written) at least this long ago,"
        " e.g. 1d (default: 0)",
    )
    purge.add_argument(
        "--include-dead", action="store_true", help="also delete failed and dead records"
    )
    purge.add_argument("--scope", help="only this scope")
    purge.add_argument(
        "--batch-size", type=_positive, default=1000, help="records per batch (default: 1000)"
    )
    purge.add_argument(
        "--pause", type=_seconds, default=0.1, help="seconds between batches (default: 0.1)"
    )
    purge.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")

    reap = sub.add_parser(
        "reap",
        help="move in-progress records whose lease lapsed to failed",
        description="Mark claims whose lease ran out (the worker died or stalled) as failed,"
        " counting the lapsed run as a failed attempt. Each write is fenced: a worker that"
        " renews or completes first wins. Safe to run from several hosts.",
    )
    _url_options(reap)
    reap.add_argument("--scope", help="only this scope")
    reap.add_argument(
        "--batch-size", type=_positive, default=1000, help="records per batch (default: 1000)"
    )
    reap.add_argument(
        "--pause", type=_seconds, default=0.1, help="seconds between batches (default: 0.1)"
    )

    show_list = sub.add_parser("list", help="list records", description="List records by key.")
    _url_options(show_list)
    show_list.add_argument(
        "--state", choices=[s.value for s in State], help="only records in this state"
    )
    show_list.add_argument("--scope", help="only this scope")
    show_list.add_argument(
        "--older-than", type=parse_duration, help="only records last written this long ago (1h)"
    )
    show_list.add_argument(
        "--limit", type=_positive, default=100, help="the most records shown (default: 100)"
    )
    show_list.add_argument("--json", action="store_true", help="one JSON object per line")
    _header_option(show_list)

    show = sub.add_parser(
        "show", help="show one record", description="Show every field of one record."
    )
    _url_options(show)
    show.add_argument("scope", help="the record's scope (consumer or function name)")
    show.add_argument("key", help="the record's key")
    show.add_argument("--json", action="store_true", help="print the record as JSON")

    redrive = sub.add_parser(
        "redrive",
        help="let dead (or failed) records run again",
        description="Set dead or failed records to failed with zero attempts under a new"
        " fencing token, so the next delivery of the message runs the handler again.",
    )
    _url_options(redrive)
    redrive.add_argument("scope", nargs="?", help="the record's scope (with KEY: one record)")
    redrive.add_argument("key", nargs="?", help="the record's key")
    redrive.add_argument(
        "--state",
        choices=("dead", "failed"),
        default="dead",
        help="with --scope or --all: the state to redrive (default: dead)",
    )
    redrive.add_argument("--scope", dest="only_scope", help="every record of this scope")
    redrive.add_argument("--all", action="store_true", help="every scope")
    redrive.add_argument(
        "--dry-run",
        action="store_true",
        help="list the records a redrive would touch and count them; change nothing",
    )
    _header_option(redrive)

    delete = sub.add_parser(
        "delete",
        help="delete one record",
        description="Delete one record, if it has not changed since it was read.",
    )
    _url_options(delete)
    delete.add_argument("scope", help="the record's scope")
    delete.add_argument("key", help="the record's key")

    configure_partitions(sub, _url_options, parse_duration, _seconds)


from onceonly.cli._partitions import configure_partitions, run_partitions  # noqa: E402


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).isoformat(timespec="seconds")


def record_json(record: Record, *, full: bool = False) -> dict[str, Any]:
    """A record as a JSON object (``full``: with payload, checkpoint and result)."""
    out: dict[str, Any] = {
        "scope": record.scope,
        "key": record.key,
        "state": record.state.value,
        "attempts": record.attempts,
        "token": record.token,
        "lease_until": _iso(record.lease_until),
        "error": record.error,
        "created_at": _iso(record.created_at),
        "updated_at": _iso(record.updated_at),
        "completed_at": _iso(record.completed_at),
        "expires_at": _iso(record.expires_at),
    }
    if full:
        out.update(
            fingerprint=record.fingerprint,
            payload=record.payload,
            checkpoint=record.checkpoint,
            result=record.result,
        )
    return out


@contextmanager
def _admin(args: argparse.Namespace) -> Iterator[Admin]:
    from onceonly.cli._store import open_existing

    store = open_existing(args.url, args, **({"table": args.table} if args.table else {}))
    try:
        yield Admin(store)
    finally:
        store.close()


def _purge(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    options: dict[str, Any] = {
        "older_than": args.older_than,
        "include_dead": args.include_dead,
        "scope": args.scope,
    }
    if args.dry_run:
        report = admin.purge(dry_run=True, **options)
        out.write(f"would purge {report.deleted} records\n")
        return 0
    bar = ProgressBar(None, "records purged")
    if bar.enabled:
        bar.total = admin.purge(dry_run=True, **options).deleted
    try:
        report = admin.purge(batch_size=args.batch_size, pause=args.pause, progress=bar, **options)
    finally:
        bar.close()
    out.write(
        f"purged {report.deleted} records in {report.batches} batches ({report.seconds:.1f} s)\n"
    )
    return 0


def _redrive(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    one = args.scope is not None or args.key is not None
    many = args.only_scope is not None or args.all
    if one == many or (one and (args.scope is None or args.key is None)):
        raise_usage("redrive takes SCOPE KEY, or --scope S, or --all")
    if args.dry_run:
        return _redrive_dry_run(admin, args, out, one=one)
    if one:
        if admin.redrive(args.scope, args.key) is None:
            sys.stderr.write(
                f"onceonly records: {args.scope} {args.key}: not redriven (absent, not dead"
                " or failed, or changed meanwhile)\n"
            )
            return 1
        out.write("redriven: 1\n")
        return 0
    n = admin.redrive_all(state=State(args.state), scope=args.only_scope)
    out.write(f"redriven: {n}\n")
    return 0


def _redrive_dry_run(admin: Admin, args: argparse.Namespace, out: TextIO, *, one: bool) -> int:
    """Print the records ``redrive`` would touch, then their count; write nothing."""
    if one:
        record = admin.show(args.scope, args.key)
        found = [] if record is None else [record]
    else:
        query = Query((State(args.state),), args.only_scope, limit=500)
        found = list(admin.iter_records(query))
    would = [r for r in found if redrive_decision(r, 0) is not None]
    if args.header:
        out.write("\t".join(LIST_COLUMNS) + "\n")
    for record in would:
        out.write(_row(record))
    out.write(f"would redrive: {len(would)}\n")
    if one and not would:
        sys.stderr.write(
            f"onceonly records: {args.scope} {args.key}: would not be redriven (absent, or"
            " not dead or failed)\n"
        )
        return 1
    return 0


def _row(record: Record) -> str:
    """One ``records list`` line: :data:`LIST_COLUMNS`, whole values, escaped."""
    values = (
        record.scope,
        record.key,
        record.state.value,
        str(record.attempts),
        _iso(record.updated_at) or "",
        record.error or "",
    )
    return "\t".join(v.translate(_ESCAPES) for v in values) + "\n"


def raise_usage(message: str) -> None:
    from onceonly.cli._main import CommandError

    raise CommandError(message)


def run_records(args: argparse.Namespace) -> int:
    """Run ``onceonly records ACTION``; returns the exit status."""
    out = sys.stdout
    with _admin(args) as admin:
        action: Callable[[Admin, argparse.Namespace, TextIO], int] = _ACTIONS[args.action]
        return action(admin, args, out)


def _reap(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    bar = ProgressBar(None, "records reaped")
    try:
        report = admin.reap(
            scope=args.scope, batch_size=args.batch_size, pause=args.pause, progress=bar
        )
    finally:
        bar.close()
    out.write(
        f"reaped {report.reaped} records; {report.skipped} skipped (a worker renewed,"
        f" completed or held them) ({report.seconds:.1f} s)\n"
    )
    return 0


def _list(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    states = (State(args.state),) if args.state else ()
    query = Query(states, args.scope, args.older_than, limit=min(args.limit, 500))
    if args.header and not args.json:
        out.write("\t".join(LIST_COLUMNS) + "\n")
    for shown, record in enumerate(admin.iter_records(query)):
        if shown >= args.limit:
            break
        out.write(json.dumps(record_json(record)) + "\n" if args.json else _row(record))
    return 0


def _show(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    record = admin.show(args.scope, args.key)
    if record is None:
        sys.stderr.write(f"onceonly records: no record {args.scope} {args.key}\n")
        return 1
    data = record_json(record, full=True)
    if args.json:
        out.write(json.dumps(data) + "\n")
    else:
        width = max(len(k) for k in data)
        for name, value in data.items():
            out.write(f"{name:<{width}}  {'' if value is None else value}\n")
    return 0


def _delete(admin: Admin, args: argparse.Namespace, out: TextIO) -> int:
    if not admin.delete(args.scope, args.key):
        sys.stderr.write(
            f"onceonly records: {args.scope} {args.key}: not deleted (absent or changed)\n"
        )
        return 1
    out.write("deleted: 1\n")
    return 0


_ACTIONS: dict[str, Callable[[Admin, argparse.Namespace, TextIO], int]] = {
    "purge": _purge,
    "reap": _reap,
    "list": _list,
    "show": _show,
    "redrive": _redrive,
    "delete": _delete,
    "partitions": run_partitions,
}
