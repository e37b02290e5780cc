# SPDX-License-Identifier: MIT
"""The ``onceonly`` command line.

``main`` builds an argparse parser with one sub-command per entry of ``COMMANDS``;
each entry adds its own options and runs with the parsed namespace, returning the
exit status. Add a sub-command by adding a :class:`Command`. Every sub-command takes
``-v/--verbose`` and ``--log-level``.

Errors print as one line (``onceonly COMMAND: error: …``) plus a hint line; the
traceback only with ``-v``. Exit statuses (:data:`EXIT_STATUSES`): 0 success, 1 the
command ran and failed (or an unexpected internal error), 2 usage or configuration
errors, 3 the store or broker cannot be reached right now, 130 interrupted (Ctrl-C).

2 and 3 tell a supervisor whether to retry: 2 is every
:class:`~onceonly.ConfigurationError` (a bad option or URL, a missing SQLite file, a
database that does not exist or a login the server refused:
:class:`~onceonly.StoreMisconfigured`, tables not migrated, a missing extra), which the
same command line will meet again; 3 is a transient :class:`~onceonly.StoreUnavailable`
or :class:`~onceonly.BrokerUnavailable` (connection refused, a timeout, a server
shutting down or starting up).
"""

from __future__ import annotations

import argparse
import logging
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from onceonly.errors import (
    BrokerUnavailable,
    ConfigurationError,
    OnceOnlyError,
    StoreUnavailable,
)

__all__ = ["COMMANDS", "EXIT_STATUSES", "Command", "CommandError", "build_parser", "main"]

#: What each exit status of the ``onceonly`` command means.
EXIT_STATUSES: dict[int, str] = {
    0: "success",
    1: "the command ran and failed, or an unexpected internal error",
    2: "usage or configuration error: fix it, a retry meets it again (a bad option or"
    " URL, no such SQLite file or database, login refused, not migrated, missing extra)",
    3: "the store or the broker cannot be reached now (connection refused, timeout,"
    " shutting down): retry later",
    130: "interrupted (Ctrl-C)",
}
_LEVELS = ("debug", "info", "warning", "error", "critical")


class CommandError(Exception):
    """A sub-command cannot run as asked; the message says why (exit status 2)."""


@dataclass(frozen=True)
class Command:
    """One sub-command.

    Attributes:
        name: what the user types.
        help: one line for ``onceonly --help``.
        description: the sub-command's ``--help`` text.
        configure: adds the sub-command's options to its parser.
        run: does the work; returns the exit status.
    """

    name: str
    help: str
    description: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    from onceonly.demo import add_arguments

    add_arguments(parser)


def _run_demo(args: argparse.Namespace) -> int:
    from onceonly.demo import DemoError, options_from_args, run_demo

    try:
        return run_demo(options_from_args(args))
    except DemoError as exc:
        raise CommandError(str(exc)) from exc


def _configure_relay(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._outbox import configure_relay

    configure_relay(parser)


def _run_relay(args: argparse.Namespace) -> int:
    from onceonly.cli._outbox import run_relay

    return run_relay(args)


def _configure_outbox(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._outbox import configure_outbox

    configure_outbox(parser)


def _run_outbox(args: argparse.Namespace) -> int:
    from onceonly.cli._outbox import run_outbox

    return run_outbox(args)


def _configure_migrate(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the store URL to create or upgrade")
    parser.add_argument(
        "--table", default=None, help="the records table (default: onceonly_records)"
    )
    parser.add_argument(
        "--partitioned",
        action="store_true",
        help="PostgreSQL: create the records table partitioned by time (see onceonly"
        " records partitions)",
    )
    from onceonly.cli._records import parse_duration

    parser.add_argument(
        "--period",
        type=parse_duration,
        default=86400.0,
        help="with --partitioned: a partition's length, e.g. 1h or 1d (default: 1d)",
    )


def _run_migrate(args: argparse.Namespace) -> int:
    from datetime import timedelta

    from onceonly._core.urls import redact_url
    from onceonly.cli._store import postgres_store
    from onceonly.stores import open_store

    options = {} if args.table is None else {"table": args.table}
    store = open_store(args.url, **options)
    try:
        if args.partitioned:
            partitioned = postgres_store(store)
            if partitioned is None:
                raise CommandError("--partitioned needs a PostgreSQL store")
            partitioned.migrate(partitioned=True, period=timedelta(seconds=args.period))
        else:
            store.migrate()
    finally:
        store.close()
    sys.stdout.write(f"migrated: {redact_url(args.url)}\n")
    return 0


def _configure_records(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._records import configure_records

    configure_records(parser)


def _run_records(args: argparse.Namespace) -> int:
    from onceonly.cli._records import run_records

    return run_records(args)


def _configure_stats(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._stats import configure_stats

    configure_stats(parser)


def _run_stats(args: argparse.Namespace) -> int:
    from onceonly.cli._stats import run_stats

    return run_stats(args)


def _configure_doctor(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._doctor import configure_doctor

    configure_doctor(parser)


def _run_doctor(args: argparse.Namespace) -> int:
    from onceonly.cli._doctor import run_doctor

    return run_doctor(args)


def _configure_dashboard(parser: argparse.ArgumentParser) -> None:
    from onceonly.cli._dashboard import configure_dashboard

    configure_dashboard(parser)


def _run_dashboard(args: argparse.Namespace) -> int:
    from onceonly.cli._dashboard import run_dashboard

    return run_dashboard(args)


COMMANDS: tuple[Command, ...] = (
    Command(
        name="migrate",
        help="create or upgrade the store's tables (safe to repeat)",
        description=(
            "Create the records and outbox tables, or upgrade them to this version's"
            " schema; safe to repeat and to run from several hosts at once. The same as"
            " store.migrate(). A SQLite file that does not exist is created (the other"
            " commands refuse one)."
        ),
        configure=_configure_migrate,
        run=_run_migrate,
    ),
    Command(
        name="demo",
        help="show duplicate charges under at-least-once delivery, with and without onceonly",
        description=(
            "Run the same workload of 'charge customer X amount Y' messages through a"
            " simulated at-least-once broker twice, with worker processes SIGKILLed at"
            " random: once with a naive check-then-act consumer, once with onceonly's"
            " Inbox. Prints what each side charged. Exits 0 only if the onceonly side"
            " charged every message exactly once."
        ),
        configure=_configure_demo,
        run=_run_demo,
    ),
    Command(
        name="relay",
        help="publish outbox rows to a broker until SIGTERM",
        description=(
            "Relay the outbox of a store to RabbitMQ, NATS JetStream or Redis Streams."
            " Each row is published with its id as the message id, confirmed by the"
            " broker, then deleted. Database outages (a restart, a failover, a killed"
            " connection) are retried with backoff until the database is back; only"
            " SIGTERM or Ctrl-C stops the relay: it finishes the batch in hand and exits 0."
        ),
        configure=_configure_relay,
        run=_run_relay,
    ),
    Command(
        name="outbox",
        help="list, count and redrive outbox rows",
        description="Inspect the outbox: list dead (or pending) rows, count them, redrive.",
        configure=_configure_outbox,
        run=_run_outbox,
    ),
    Command(
        name="records",
        help="purge, reap, list, show, redrive and delete records",
        description=(
            "Operate the records table: retention (purge expired records in batches), the"
            " reaper of lapsed claims, inspection, redrive of dead records and deletion."
        ),
        configure=_configure_records,
        run=_run_records,
    ),
    Command(
        name="stats",
        help="per-scope counts by state, stuck claims, expired rows and table size",
        description="Print per-scope record counts by state, the age of the oldest"
        " in-progress claim, expired records not purged yet and the table's size.",
        configure=_configure_stats,
        run=_run_stats,
    ),
    Command(
        name="doctor",
        help="check schema, clocks, pooling and broker settings; exit 1 on a problem",
        description="Check the store (schema version, clock skew, transaction pooling) and"
        " brokers (Redis eviction policy, NATS redelivery horizon against --ttl). Each"
        " problem says what to do; the exit status is 1 when there is one.",
        configure=_configure_doctor,
        run=_run_doctor,
    ),
    Command(
        name="dashboard",
        help="serve the operator dashboard (records, dead letters, redrive) on 127.0.0.1",
        description="Serve the operator dashboard over HTTP: records by state and scope,"
        " the duplicate rate, dead records and their errors, redrive, release and delete,"
        " the outbox. Binds 127.0.0.1 unless --host; read-only unless the"
        " ONCEONLY_DASHBOARD_TOKEN environment variable holds the operator token.",
        configure=_configure_dashboard,
        run=_run_dashboard,
    ),
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("onceonly")
    except PackageNotFoundError:
        return "unknown"


def _common_options(defaults: bool) -> argparse.ArgumentParser:
    """-v and --log-level, accepted before and after the sub-command's name."""
    common = argparse.ArgumentParser(add_help=False)
    default = None if defaults else argparse.SUPPRESS
    common.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0 if defaults else argparse.SUPPRESS,
        help="log more (-v: info, -vv: debug) and print tracebacks of errors",
    )
    common.add_argument(
        "--log-level",
        choices=_LEVELS,
        default=default,
        type=str.lower,
        help="the level of log lines written to stderr (overrides -v)",
    )
    return common


def _epilog() -> str:
    import textwrap

    lines = ["exit statuses:"] + [
        textwrap.fill(what, 79, initial_indent=f"  {code:<4} ", subsequent_indent=" " * 7)
        for code, what in EXIT_STATUSES.items()
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The parser of the ``onceonly`` command, with every sub-command."""
    parser = argparse.ArgumentParser(
        prog="onceonly",
        description="onceonly: side effects once under at-least-once delivery.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[_common_options(defaults=True)],
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {_version()}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        child = sub.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            epilog=_epilog(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
            parents=[_common_options(defaults=False)],
        )
        command.configure(child)
        child.set_defaults(run=command.run)
    return parser


def _setup_logging(args: argparse.Namespace) -> None:
    """Log to stderr at the level -v / --log-level asked for (none asked: leave it)."""
    verbose = getattr(args, "verbose", 0) or 0
    named = getattr(args, "log_level", None)
    if named is None and not verbose:
        return
    level = (
        getattr(logging, named.upper())
        if named
        else (logging.INFO if verbose == 1 else logging.DEBUG)
    )
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    logging.getLogger("onceonly").setLevel(level)


def _hint(exc: BaseException) -> str | None:
    """What to do next: the first line of the error class's docstring."""
    doc = (type(exc).__doc__ or "").strip()
    first = " ".join(doc.split("\n\n", 1)[0].split())  # the summary paragraph
    return first or None


def _status(exc: BaseException) -> int:
    # first: StoreMisconfigured and NotMigrated are store errors too, but no retry helps
    if isinstance(exc, (ConfigurationError, CommandError)):
        return 2
    if isinstance(exc, (StoreUnavailable, BrokerUnavailable)):
        return 3
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``onceonly`` command with ``argv`` (default: ``sys.argv[1:]``).

    Returns:
        The exit status.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (already printed)
        return exc.code if isinstance(exc.code, int) else 2
    run: Callable[[argparse.Namespace], int] = args.run
    _setup_logging(args)
    verbose = bool(getattr(args, "verbose", 0))
    try:
        return run(args)
    except KeyboardInterrupt:
        sys.stderr.write("\ninterrupted\n")
        return 130
    except (CommandError, OnceOnlyError) as exc:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        first = " ".join(str(exc).split()) or type(exc).__name__
        sys.stderr.write(f"onceonly {args.command}: error: {first}\n")
        hint = None if isinstance(exc, CommandError) else _hint(exc)
        if hint:
            sys.stderr.write(f"hint ({type(exc).__name__}): {hint}\n")
        return _status(exc)
    except Exception as exc:
        if verbose:
            traceback.print_exc(file=sys.stderr)
        sys.stderr.write(
            f"onceonly {args.command}: internal error: {type(exc).__name__}: {exc}\n"
            + ("" if verbose else "run again with -v for the traceback\n")
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
