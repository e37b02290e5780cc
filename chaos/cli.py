# SPDX-License-Identifier: MIT
"""``python -m chaos``: the whole pipeline under faults, then the invariant checker.

Exit status: 0 when lost, doubled and stuck are all 0 (and nothing else is wrong:
no phantom effect, every request placed, the queues readable); 1 when the checker
found a violation; 2 when the run could not be set up (the broker unreachable, no
PostgreSQL server binaries) or broke down.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import sys
import traceback
from collections.abc import Callable
from dataclasses import fields
from types import FrameType

from chaos.run import ChaosError, Options, execute
from chaos.spec import ROLES

__all__ = ["main", "parse"]


def _number(low: float, *, integer: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:g}, not {text}")
        return value

    return parse


def _share(text: str) -> float:
    value = _number(0.0)(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {text}")
    return value


def _roles(text: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in text.split(",") if r.strip())
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown roles {unknown}; choose from {ROLES}")
    return roles


def parse(argv: list[str]) -> tuple[Options, argparse.Namespace]:
    """The :class:`Options` of a command line (and the parsed namespace)."""
    d = Options()
    p = argparse.ArgumentParser(
        prog="python -m chaos", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    count, positive = _number(0, integer=True), _number(1, integer=True)
    seconds = _number(0.0)
    add = p.add_argument
    add("--messages", type=positive, default=d.messages, help="distinct messages (orders)")
    add("--duplicates", type=_share, default=d.duplicates, help="share sent twice, same id")
    add("--producers", type=positive, default=d.producers)
    add("--relays", type=positive, default=d.relays)
    add("--consumers", type=positive, default=d.consumers)
    add("--concurrency", type=positive, default=d.concurrency, help="handlers per consumer")
    add("--producer-concurrency", type=positive, default=d.producer_concurrency)
    add("--relay-batch", type=positive, default=d.relay_batch)
    add("--kill-every", type=seconds, default=d.kill_every, help="seconds between SIGKILLs; 0: off")
    add(
        "--terminate-every",
        type=seconds,
        default=d.terminate_every,
        help="seconds between pg_terminate_backend rounds; 0: off",
    )
    add(
        "--pg-restart-every",
        type=seconds,
        default=d.pg_restart_every,
        help="seconds between immediate restarts of the private PostgreSQL; 0: off",
    )
    add("--kill-roles", type=_roles, default=d.kill_roles, help="comma-separated roles to SIGKILL")
    add(
        "--terminate-roles",
        type=_roles,
        default=d.terminate_roles,
        help="comma-separated roles whose backends pg_terminate_backend hits",
    )
    add(
        "--seconds",
        type=_number(1.0),
        default=d.seconds,
        help="the planned length of the run; past it the drain waits only while the"
        " pipeline progresses",
    )
    add(
        "--max-seconds",
        type=_number(1.0),
        default=d.max_seconds,
        help="the absolute cap of the run (default: 3 x --seconds)",
    )
    add("--settle", type=seconds, default=d.settle, help="quiet seconds that mean quiescence")
    add(
        "--stall",
        type=seconds,
        default=d.stall,
        help="seconds without progress that end the faults, and the drain past --seconds",
    )
    add("--seed", type=count, default=d.seed)
    add(
        "--amqp",
        dest="amqp_url",
        default=os.environ.get("ONCEONLY_TEST_AMQP", d.amqp_url),
        help="RabbitMQ URL (default $ONCEONLY_TEST_AMQP or the local guest account)",
    )
    add("--broker", choices=("rabbitmq", "kafka"), default=d.broker, help="the broker")
    add(
        "--kafka",
        dest="kafka_bootstrap",
        default=os.environ.get("ONCEONLY_TEST_KAFKA", d.kafka_bootstrap),
        help="Kafka host:port, with --broker kafka (default $ONCEONLY_TEST_KAFKA or Tansu's)",
    )
    add("--pg-bindir", default=d.pg_bindir, help="directory of initdb and pg_ctl")
    add("--workdir", default=d.workdir, help="parent of the run's temporary directory")
    add("--keep", action="store_true", help="keep the run's directory (logs, status files)")
    add("--progress-every", type=seconds, default=d.progress_every, help="0: no progress lines")
    add("--summary-json", default=None, metavar="PATH", help="also write the numbers as JSON")
    args = p.parse_args(argv)
    names = {f.name for f in fields(Options)}
    values = {k: v for k, v in vars(args).items() if k in names}
    return Options(**values), args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwind: kill the workers, stop the cluster


def main(argv: list[str] | None = None) -> int:
    options, args = parse(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _terminate)
    from chaos.report import render, to_json

    try:
        result = asyncio.run(execute(options))
    except ChaosError as exc:
        sys.stderr.write(f"chaos: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("chaos: interrupted\n")
        return 2
    except Exception:
        sys.stderr.write("chaos: the run broke down:\n" + traceback.format_exc())
        return 2
    sys.stdout.write(render(result) + "\n")
    sys.stdout.flush()
    if args.summary_json:
        with open(args.summary_json, "w", encoding="utf-8") as fh:
            json.dump(to_json(result), fh, indent=1)
    return 0 if result.ok else 1
