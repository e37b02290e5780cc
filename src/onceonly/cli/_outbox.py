# SPDX-License-Identifier: MIT
"""``onceonly relay`` and ``onceonly outbox``: run a relay, inspect and redrive the outbox."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
import urllib.parse
from typing import Any

from onceonly._core.urls import redact_url
from onceonly.cli._store import add_create_option, check_sqlite_exists, open_existing
from onceonly.errors import ConfigurationError
from onceonly.messaging import AsyncPublisher

__all__ = ["configure_outbox", "configure_relay", "publisher_from_url", "run_outbox", "run_relay"]


def publisher_from_url(url: str, **options: Any) -> AsyncPublisher:
    """A publisher for ``amqp://``, ``nats://``, ``redis://`` or ``kafka://`` URLs.

    Raises:
        ConfigurationError: an unknown scheme, or the broker's extra is not installed.
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    try:
        if scheme in ("amqp", "amqps"):
            from onceonly.brokers.rabbitmq import RabbitMQPublisher

            return RabbitMQPublisher(url, **options)
        if scheme in ("nats", "tls"):
            from onceonly.brokers.nats import NatsPublisher

            return NatsPublisher(url, **options)
        if scheme in ("redis", "rediss", "unix"):
            from onceonly.brokers.redis_streams import RedisStreamsPublisher

            return RedisStreamsPublisher(url, **options)
        if scheme == "kafka":
            from onceonly.brokers.kafka import KafkaPublisher

            return KafkaPublisher(url, **options)
    except ImportError as exc:
        extra = {
            "amqp": "rabbitmq",
            "amqps": "rabbitmq",
            "nats": "nats",
            "tls": "nats",
            "kafka": "kafka",
        }.get(scheme, "redis")
        raise ConfigurationError(
            f"the {scheme} broker needs the {extra} extra: pip install 'onceonly[{extra}]'"
        ) from exc
    raise ConfigurationError(
        f"unknown broker URL scheme {scheme!r}: use amqp://, nats://, redis:// or kafka://"
    )


def configure_relay(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the store URL holding the outbox")
    parser.add_argument(
        "--broker",
        required=True,
        help="the broker: amqp://…, nats://…, redis://… or kafka://host:port",
    )
    parser.add_argument("--table", default=None, help="outbox table (default: the store's)")
    parser.add_argument(
        "--batch-size", type=int, default=100, help="rows claimed per batch (default 100)"
    )
    parser.add_argument(
        "--poll-interval",
        type=float,
        default=1.0,
        help="seconds between polls when idle and no wake-up arrives (default 1.0)",
    )
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=10,
        help="failed publishes after which a row is dead (default 10)",
    )
    parser.add_argument(
        "--ordered", action="store_true", help="per-key ordering: one row per key in flight"
    )
    parser.add_argument(
        "--prefix", default="", help="prefix for subjects (nats) or stream keys (redis)"
    )
    add_create_option(parser)


def _prefix_option(broker: str, prefix: str) -> dict[str, Any]:
    if not prefix:
        return {}
    scheme = urllib.parse.urlsplit(broker).scheme.lower()
    if scheme in ("nats", "tls"):
        return {"subject_prefix": prefix}
    if scheme in ("redis", "rediss", "unix"):
        return {"stream_prefix": prefix}
    raise ConfigurationError("--prefix applies to nats:// and redis:// brokers")


def _log_to_stderr() -> None:
    """Send onceonly's INFO and above to stderr, unless logging is configured already:
    a relay is a service, and its outage warnings and recovery lines are for the
    operator."""
    logger = logging.getLogger("onceonly")
    configured = [h for h in logger.handlers if not isinstance(h, logging.NullHandler)]
    if configured or logging.getLogger().handlers:
        return  # -v / --log-level (or the application) set logging up already
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)


async def _relay(args: argparse.Namespace) -> int:
    from onceonly.outbox import AsyncRelay
    from onceonly.stores import open_async_store

    check_sqlite_exists(args.url, args)
    store = open_async_store(args.url)
    publisher = publisher_from_url(args.broker, **_prefix_option(args.broker, args.prefix))
    relay = AsyncRelay(
        store,
        publisher,
        table=args.table,
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        max_attempts=args.max_attempts,
        ordered=args.ordered,
    )
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, relay.stop)
    _log_to_stderr()
    sys.stderr.write(f"onceonly relay: {redact_url(args.url)} -> {redact_url(args.broker)}\n")
    try:
        stats = await relay.run()
    finally:
        await publisher.close()
        await store.close()
    sys.stderr.write(
        f"onceonly relay: stopped; published {stats.published}, failed {stats.failed},"
        f" dead {stats.dead}\n"
    )
    return 0


def run_relay(args: argparse.Namespace) -> int:
    return asyncio.run(_relay(args))


def _outbox_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--url", default=default, help="the store URL holding the outbox")
    parser.add_argument("--table", default=default, help="outbox table (default: the store's)")


def configure_outbox(parser: argparse.ArgumentParser) -> None:
    # --url/--table go before the action (the original spelling) or after it, like
    # `onceonly records ACTION --url …`; SUPPRESS keeps an action's absent option from
    # overwriting one given before it.
    _outbox_options(parser, None)
    add_create_option(parser)
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = sub.add_parser("list", help="list rows (dead by default) as JSON lines")
    _outbox_options(show, argparse.SUPPRESS)
    show.add_argument(
        "--state", choices=("dead", "pending"), default="dead", help="which rows (default: dead)"
    )
    show.add_argument("--limit", type=int, default=100, help="the most rows (default: 100)")
    redrive = sub.add_parser("redrive", help="put dead rows back to pending")
    _outbox_options(redrive, argparse.SUPPRESS)
    which = redrive.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", help="one message id")
    which.add_argument("--all", action="store_true", help="every dead row")
    counts = sub.add_parser("counts", help="pending and dead counts")
    _outbox_options(counts, argparse.SUPPRESS)


def run_outbox(args: argparse.Namespace) -> int:
    from onceonly.outbox import Outbox

    if not args.url:
        raise ConfigurationError("onceonly outbox needs --url (the store holding the outbox)")
    store = open_existing(args.url, args)
    try:
        outbox = Outbox(store, table=args.table)
        out = sys.stdout
        if args.action == "list":
            for row in outbox.rows(args.state, args.limit):
                m = row.message
                record = {
                    "id": m.id,
                    "topic": m.topic,
                    "key": m.key,
                    "attempts": m.attempts,
                    "last_error": row.last_error,
                    "payload": m.decoded(),
                }
                out.write(json.dumps(record) + "\n")
        elif args.action == "redrive":
            n = outbox.redrive(None if args.all else args.id)
            out.write(f"redriven: {n}\n")
            if not args.all and n == 0:
                sys.stderr.write(f"onceonly outbox: no dead row with id {args.id}\n")
                return 1
        else:
            out.write(json.dumps(outbox.counts()) + "\n")
    finally:
        store.close()
    return 0
