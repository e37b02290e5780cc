# SPDX-License-Identifier: MIT
"""``onceonly demo``: the same crashing, duplicating workload through both consumers.

Steps: build the workload; create the business tables and onceonly's records table;
for each side (naive first, then onceonly) fill a fresh queue with the producer's
sends and drain it with SIGKILLed workers; count the charges; print the table and
the verdict. The exit status is 0 only when the onceonly side charged every message
exactly once — the naive side is expected to fail and does not change it.

By default everything lives in a temporary directory that is deleted afterwards. With
``--url``, the business tables get a per-run suffix and are dropped at the end, and
onceonly's records use a per-run consumer name (and a one-hour TTL).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import onceonly
from onceonly.demo._broker import Broker
from onceonly.demo._database import (
    DemoError,
    Tables,
    Target,
    create_tables,
    drop_tables,
    parse_url,
    read_charges,
    temporary_target,
)
from onceonly.demo._report import Progress, SideResult, count_charges, render_table, verdict
from onceonly.demo._supervisor import run_side
from onceonly.demo._worker import WorkerSpec
from onceonly.demo._workload import make_workload

__all__ = ["DemoOptions", "add_arguments", "options_from_args", "run_demo"]

SIDES = ("naive", "onceonly")


@dataclass(frozen=True)
class DemoOptions:
    """How to run the demo (see ``onceonly demo --help``)."""

    messages: int = 2000
    workers: int = 4
    crashes: int = 50
    duplicate_rate: float = 0.3
    visibility_timeout: float = 0.75
    seed: int = 1
    url: Target | None = None
    progress: bool = True
    keep: bool = False
    timeout: float = 300.0


def _int_at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, not {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_count = _int_at_least(0)


def _float_at_least(low: float, *, inclusive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or not (value >= low if inclusive else value > low):
            sign = ">=" if inclusive else ">"
            raise argparse.ArgumentTypeError(f"must be {sign} {low:g}, not {text}")
        return value

    return parse


def _share(text: str) -> float:
    value = _float_at_least(0.0, inclusive=True)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def _url(text: str) -> Target:
    try:
        return parse_url(text)
    except DemoError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the demo's options to ``parser``."""
    d = DemoOptions()
    parser.add_argument(
        "--messages",
        type=_positive_int,
        default=d.messages,
        metavar="N",
        help=f"distinct messages to charge (default {d.messages})",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=d.workers,
        metavar="N",
        help=f"worker processes per side (default {d.workers})",
    )
    parser.add_argument(
        "--crashes",
        type=_count,
        default=d.crashes,
        metavar="N",
        help=f"workers SIGKILLed per side, at random points; 0 for none (default {d.crashes})",
    )
    parser.add_argument(
        "--duplicates",
        type=_share,
        default=d.duplicate_rate,
        metavar="SHARE",
        dest="duplicate_rate",
        help=f"share of messages the producer sends twice (default {d.duplicate_rate:g})",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=_float_at_least(0.0, inclusive=False),
        default=d.visibility_timeout,
        metavar="SECONDS",
        help=f"seconds before an unacked delivery comes back (default {d.visibility_timeout:g})",
    )
    parser.add_argument(
        "--seed", type=int, default=d.seed, help=f"workload and crash seed (default {d.seed})"
    )
    parser.add_argument(
        "--url",
        type=_url,
        default=None,
        metavar="URL",
        help="database: sqlite:///file.db, postgresql://user@host:5432/db or mysql://… "
        "(default: a temporary SQLite file)",
    )
    parser.add_argument(
        "--no-progress", action="store_false", dest="progress", help="no progress bar"
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="keep the database, queues and tables afterwards (their location is printed)",
    )
    parser.add_argument(
        "--timeout",
        type=_float_at_least(0.0, inclusive=False),
        default=d.timeout,
        metavar="SECONDS",
        help=f"give up on a side after this long (default {d.timeout:g})",
    )


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    """The :class:`DemoOptions` of parsed arguments."""
    return DemoOptions(
        messages=args.messages,
        workers=args.workers,
        crashes=args.crashes,
        duplicate_rate=args.duplicate_rate,
        visibility_timeout=args.visibility_timeout,
        seed=args.seed,
        url=args.url,
        progress=args.progress,
        keep=args.keep,
        timeout=args.timeout,
    )


def _migrate(target: Target) -> None:
    """Create (or upgrade) onceonly's records table."""
    try:
        store = onceonly.open_store(target.url)
    except onceonly.ConfigurationError as exc:
        raise DemoError(str(exc)) from exc
    try:
        store.migrate()
    finally:
        store.close()


def run_demo(
    options: DemoOptions, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run both sides, print the table and the verdict; 0 if onceonly charged exactly once.

    Raises:
        DemoError: the database cannot be used.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    run_id = secrets.token_hex(4)
    workdir = tempfile.mkdtemp(prefix="onceonly-demo-")
    target = options.url if options.url is not None else temporary_target(workdir)
    tables = Tables.for_run(None if target.temporary else run_id)
    workload = make_workload(options.messages, options.seed, options.duplicate_rate)
    progress = Progress(err, enabled=err.isatty() and options.progress)
    message_ids = [m.id for m in workload.messages]
    crash_text = f"{options.crashes} SIGKILLs at random points" if options.crashes else "no crashes"
    out.write(
        f"workload:  {len(workload.messages):,} messages 'charge customer X amount Y',"
        f" {workload.producer_duplicates:,} of them sent twice by the producer\n"
        f"each side: {options.workers} worker processes, {crash_text},"
        f" visibility timeout {options.visibility_timeout:g}s\n"
        f"database:  {target.describe()}\n"
    )
    out.flush()
    results: list[SideResult] = []
    prepared = False
    try:
        create_tables(target, tables)
        prepared = True
        _migrate(target)
        for side in SIDES:
            broker_path = os.path.join(workdir, f"queue-{side}.db")
            Broker.create(broker_path, workload.sends, options.visibility_timeout).close()
            spec = WorkerSpec(
                side=side,
                broker_path=broker_path,
                visibility_timeout=options.visibility_timeout,
                target=target,
                tables=tables,
                consumer=f"demo-billing-{run_id}",
            )
            progress.start(side)
            run = run_side(
                spec,
                workers=options.workers,
                crashes=options.crashes,
                rng=random.Random(options.seed),
                timeout=options.timeout,
                progress=progress.update,
            )
            progress.finish()
            if run.worker_failures:
                err.write(
                    f"onceonly demo: {run.worker_failures} {side} worker(s) failed on their own;"
                    " see above\n"
                )
            if not run.drained:
                err.write(f"onceonly demo: the {side} side timed out before its queue drained\n")
            counters = dict(run.counters)
            results.append(
                SideResult(
                    name=side,
                    messages=len(workload.messages),
                    deliveries=counters.pop("deliveries", 0),
                    crashes=run.crashes,
                    charges=count_charges(message_ids, read_charges(target, tables.charges(side))),
                    seconds=run.seconds,
                    counters=counters,
                )
            )
    finally:
        if options.keep:
            err.write(f"onceonly demo: kept {workdir}")
            if not target.temporary:
                err.write(
                    f" and tables {tables.naive_charges}, {tables.naive_processed},"
                    f" {tables.onceonly_charges}"
                )
            err.write("\n")
        else:
            if prepared and not target.temporary:
                try:
                    drop_tables(target, tables)
                except Exception as exc:  # do not hide the error that got us here
                    err.write(f"onceonly demo: could not drop the demo tables: {exc}\n")
            shutil.rmtree(workdir, ignore_errors=True)
    out.write("\n" + render_table(results) + "\n\n")
    ok, line = verdict(results[-1])
    out.write(line + "\n")
    out.flush()
    return 0 if ok else 1
