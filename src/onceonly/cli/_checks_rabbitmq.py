# SPDX-License-Identifier: MIT
"""``onceonly doctor`` for RabbitMQ: a queue's message TTL (its ``x-message-ttl``
argument or the ``message-ttl`` of the policy in effect) against the inbox ttl.

A queue's arguments and policies are not visible over AMQP; they are read from the
management HTTP API (``rabbitmq_management`` plugin, port 15672 by default), with the
AMQP URL's credentials unless ``api`` says otherwise. No client library is needed.

.. versionadded:: 0.3
"""

from __future__ import annotations

import base64
import json
import math
import re
import urllib.parse
import urllib.request
from typing import Any

from onceonly._core.window import Bound, uncovered
from onceonly.cli._checks import Finding

__all__ = ["check_rabbitmq", "management_url"]


def management_url(amqp_url: str) -> str:
    """The management API's base URL for an AMQP URL: same host and credentials, port
    15672 (``http``; ``https`` for ``amqps``)."""
    parts = urllib.parse.urlsplit(amqp_url)
    scheme = "https" if parts.scheme.lower() == "amqps" else "http"
    auth = ""
    if parts.username is not None:
        auth = parts.username + (f":{parts.password}" if parts.password is not None else "") + "@"
    return f"{scheme}://{auth}{parts.hostname or 'localhost'}:15672"


def _vhost(amqp_url: str) -> str:
    path = urllib.parse.urlsplit(amqp_url).path
    return urllib.parse.unquote(path[1:]) if len(path) > 1 else "/"


def _get(api: str, path: str, timeout: float) -> Any:
    parts = urllib.parse.urlsplit(api)
    netloc = parts.hostname or "localhost"
    if parts.port:
        netloc += f":{parts.port}"
    request = urllib.request.Request(f"{parts.scheme}://{netloc}{path}")
    user = urllib.parse.unquote(parts.username or "guest")
    password = urllib.parse.unquote(parts.password or "guest")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def effective_policy(policies: list[dict[str, Any]], queue: str) -> dict[str, Any]:
    """The definition of the policy RabbitMQ applies to ``queue``: the matching one
    (pattern searched in the name, applied to queues) of highest priority."""
    matching = [
        p
        for p in policies
        if p.get("apply-to", "all") in ("all", "queues", "classic_queues", "quorum_queues")
        and re.search(str(p.get("pattern", "")), queue)
    ]
    if not matching:
        return {}
    best = max(matching, key=lambda p: int(p.get("priority", 0)))
    return dict(best.get("definition") or {})


def queue_bounds(info: dict[str, Any]) -> list[Bound]:
    """The redelivery bounds of one queue from its management API document."""
    name = info.get("name", "?")
    ttls: list[Bound] = []
    arg = (info.get("arguments") or {}).get("x-message-ttl")
    if isinstance(arg, (int, float)) and arg >= 0:
        ttls.append(Bound(f"queue {name} x-message-ttl", arg / 1000))
    policy = (info.get("effective_policy_definition") or {}).get("message-ttl")
    if isinstance(policy, (int, float)) and policy >= 0:
        ttls.append(Bound(f"queue {name} policy message-ttl", policy / 1000))
    if not ttls:
        return [Bound(f"queue {name} (no message TTL)", math.inf)]
    # RabbitMQ applies the lower of the argument and the policy
    return [min(ttls, key=lambda b: b.seconds)]


def check_rabbitmq(
    amqp_url: str, queue: str, ttl: float | None, *, api: str | None = None, timeout: float = 5
) -> list[Finding]:
    """Whether an inbox ``ttl`` covers how long ``queue`` keeps a message."""
    base = api or management_url(amqp_url)
    vhost = urllib.parse.quote(_vhost(amqp_url), safe="")
    info = _get(base, f"/api/queues/{vhost}/{urllib.parse.quote(queue, safe='')}", timeout)
    if not info.get("effective_policy_definition"):
        # the queue document shows its policy only once the statistics caught up
        info["effective_policy_definition"] = effective_policy(
            _get(base, f"/api/policies/{vhost}", timeout), queue
        )
    bounds = queue_bounds(info)
    if math.isinf(bounds[0].seconds):
        return [
            Finding(
                "rabbitmq",
                f"queue {queue} has no message TTL: a message waits as long as its consumers"
                " are down, so the inbox ttl must outlast your longest outage",
                ok=True,
            )
        ]
    problem = uncovered(ttl, bounds)
    if problem is not None:
        return [
            Finding(
                "rabbitmq",
                problem,
                "raise the inbox ttl above the queue's message TTL, or lower the TTL",
            )
        ]
    return [Finding("rabbitmq", f"the inbox ttl covers {bounds[0].name}", ok=True)]
