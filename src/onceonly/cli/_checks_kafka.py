# SPDX-License-Identifier: MIT
"""``onceonly doctor`` for Kafka: each topic's retention (``retention.ms``, read with
``DescribeConfigs``) against the inbox ttl. A consumer group reads a record again for
as long as the topic keeps it (a lost position, an offset reset), so a ttl shorter than
the retention lets such a read run the handler again.

A broker that does not report a topic's retention (Tansu, for a topic created without
one) gets an *unknown* finding, never a pass.

.. versionadded:: 0.4
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from onceonly._core.window import uncovered
from onceonly.cli._checks import Finding

__all__ = ["check_kafka"]


def check_kafka(
    url: str, topics: Sequence[str], ttl: float | None, *, timeout: float = 5.0
) -> list[Finding]:
    """Whether an inbox ``ttl`` covers how long each of ``topics`` keeps a record.

    Args:
        url: ``kafka://host:port[,host:port]`` (or a bare ``host:port`` list).
        topics: the topics the consumers read.
        ttl: the inbox ttl in seconds (``None``: unlimited).
        timeout: seconds to wait for the broker.
    """
    from onceonly.brokers.kafka._publisher import bootstrap_of
    from onceonly.brokers.kafka._wire import retention_bounds

    bounds, unknown = retention_bounds(
        {"bootstrap.servers": bootstrap_of(url)}, topics, timeout=timeout
    )
    out = [
        Finding(
            "kafka",
            f"the retention of topic {topic} is unknown (the broker reports no retention.ms):"
            " the inbox ttl cannot be checked against it",
            "set the topic's retention.ms explicitly (kafka-configs --alter), at most the"
            " inbox ttl, or check the broker's default retention by hand",
        )
        for topic in unknown
    ]
    for bound in bounds:
        if ttl is None:
            out.append(Finding("kafka", f"the inbox ttl is unlimited ({bound.name})", ok=True))
            continue
        problem = uncovered(ttl, [bound])
        if problem is not None:
            out.append(
                Finding(
                    "kafka",
                    problem,
                    "raise the inbox ttl above the topic's retention, or lower its retention.ms",
                )
            )
        elif math.isfinite(bound.seconds):
            out.append(Finding("kafka", f"the inbox ttl covers {bound.name}", ok=True))
    return out
