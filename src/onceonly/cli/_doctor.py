# SPDX-License-Identifier: MIT
"""``onceonly doctor``: check a deployment; exit 1 when something is wrong."""

from __future__ import annotations

import argparse
import sys

from onceonly.cli._checks import (
    Finding,
    broker_scheme,
    check_nats,
    check_pool,
    check_redis,
    check_store,
)
from onceonly.cli._records import _positive, parse_duration

__all__ = ["configure_doctor", "run_doctor"]


def configure_doctor(parser: argparse.ArgumentParser) -> None:
    """Add the ``doctor`` options to ``parser``."""
    parser.add_argument(
        "--url", required=True, help="the store URL (sqlite:///…, postgresql://…, redis://…)"
    )
    parser.add_argument("--table", help="the records table (default: onceonly_records)")
    parser.add_argument(
        "--broker",
        action="append",
        default=[],
        help="a broker URL to check (redis://, nats://, amqp://, kafka://)",
    )
    parser.add_argument(
        "--ttl",
        type=parse_duration,
        default=7 * 86400.0,
        help="the inbox ttl to check against broker redelivery horizons (default: 7d)",
    )
    parser.add_argument("--stream", help="NATS: the JetStream stream the consumer reads")
    parser.add_argument("--consumer", help="NATS: the durable consumer name")
    parser.add_argument("--queue", help="RabbitMQ: the queue the consumer reads")
    parser.add_argument(
        "--topic",
        action="append",
        default=[],
        help="Kafka: a topic the consumers read (repeat for several)",
    )
    parser.add_argument(
        "--rabbitmq-api",
        help="RabbitMQ: the management API URL (default: the AMQP host, port 15672, the"
        " AMQP credentials)",
    )
    parser.add_argument(
        "--concurrency",
        type=_positive,
        default=None,
        help="the handlers your consumers run at once (checked against the pool size)",
    )
    parser.add_argument(
        "--pool-size",
        type=_positive,
        default=None,
        help="with --concurrency: your store's pool max_size (default: this store's, 10)",
    )


def _check_broker(broker: str, args: argparse.Namespace) -> list[Finding]:
    scheme = broker_scheme(broker)
    try:
        if scheme in ("redis", "rediss"):
            return check_redis(broker)
        if scheme in ("nats", "tls"):
            if not args.stream:
                return [Finding("nats", "cannot check NATS without --stream", "pass --stream")]
            return check_nats(broker, args.stream, args.consumer, args.ttl)
        if scheme in ("amqp", "amqps"):
            if not args.queue:
                return [
                    Finding("rabbitmq", "cannot check RabbitMQ without --queue", "pass --queue")
                ]
            from onceonly.cli._checks_rabbitmq import check_rabbitmq

            return check_rabbitmq(broker, args.queue, args.ttl, api=args.rabbitmq_api)
        if scheme == "kafka":
            if not args.topic:
                return [Finding("kafka", "cannot check Kafka without --topic", "pass --topic")]
            from onceonly.cli._checks_kafka import check_kafka

            return check_kafka(broker, args.topic, args.ttl)
    except ImportError as exc:
        return [Finding(scheme, f"the client library is missing ({exc})", "install the extra")]
    except Exception as exc:  # any client error: report it as a finding, never a traceback
        return [
            Finding(
                scheme,
                f"could not check {scheme}:// ({type(exc).__name__}: {exc})",
                "check the URL, the stream and consumer names, and that the broker is up",
            )
        ]
    return [
        Finding(
            "broker",
            f"no checks for {scheme}:// brokers",
            "use redis://, nats://, amqp:// or kafka://",
        )
    ]


def run_doctor(args: argparse.Namespace) -> int:
    """Run every check; print each finding with what to do; 1 when any is a problem."""
    from onceonly.cli._store import open_existing

    findings: list[Finding] = []
    store = open_existing(args.url, args, **({"table": args.table} if args.table else {}))
    try:
        findings += check_store(store)
        if args.concurrency is not None:
            findings += check_pool(store, args.concurrency, args.pool_size)
    finally:
        store.close()
    for broker in args.broker:
        findings += _check_broker(broker, args)
    problems = [f for f in findings if not f.ok]
    for f in findings:
        if f.ok:
            sys.stdout.write(f"ok    {f.check}: {f.what}\n")
        else:
            sys.stdout.write(f"FAIL  {f.check}: {f.what}\n      fix: {f.fix}\n")
    sys.stdout.write(f"{len(problems)} problem(s)\n")
    return 1 if problems else 0
