# SPDX-License-Identifier: MIT
"""Outbox-backed enqueue of Celery tasks, and the publisher a relay sends them with.

``enqueue(tx, task, *args, **kwargs)`` writes one outbox row in the business
transaction: its topic is ``celery:<task name>``, its payload ``{"args", "kwargs",
"options"}``. The relay hands the row to :class:`CeleryPublisher`, which sends it with
Celery's own ``send_task`` (so the message is whatever Celery's protocol and the app's
serializer, routes and broker make of it) and **the outbox row's id as the task id**.
A relay that crashes between the broker's acceptance and deleting the row sends the
row again under the same task id; :func:`~onceonly.contrib.celery.idempotent_task`
keyed by the task id (its default) runs it once.

Events (``tx.publish``) and tasks may share one outbox table and one relay: the
publisher sends ``celery:`` rows to Celery and hands the others to ``others``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import Any, overload

from kombu.exceptions import OperationalError

from onceonly.errors import BrokerUnavailable, ConfigurationError, PublishError
from onceonly.inbox import AsyncTx, Tx
from onceonly.messaging import AsyncPublisher, OutboxMessage, Publisher

__all__ = ["TOPIC_PREFIX", "AsyncCeleryPublisher", "CeleryPublisher", "enqueue", "task_call"]

#: The topic of an outbox row that is a Celery task is this prefix and the task's name.
TOPIC_PREFIX = "celery:"

#: ``apply_async`` options an outbox row may carry (all JSON, none tied to the moment
#: of the call); ``countdown`` counts from the relay's send.
OPTIONS = frozenset(
    {
        "queue",
        "routing_key",
        "exchange",
        "priority",
        "countdown",
        "expires",
        "time_limit",
        "soft_time_limit",
    }
)


def _name_of(task: Any) -> str:
    name = getattr(task, "name", None)
    if isinstance(name, str):
        return name  # a Task
    if isinstance(task, str):
        return task  # a task name
    raise ConfigurationError(f"enqueue() needs a Celery task, signature or task name, not {task!r}")


def task_call(task: Any, *args: Any, **kwargs: Any) -> tuple[str, dict[str, Any]]:
    """The outbox ``(topic, payload)`` of a task call, for ``outbox.publish(conn, ...)``.

    Args:
        task: a Celery task, its name, or a signature (``task.s(1).set(queue="q")``: its
            arguments come first, its options are kept).
        *args: the task's positional arguments (JSON values).
        **kwargs: the task's keyword arguments (JSON values).

    Returns:
        The topic (``celery:`` and the task's name) and the payload ``{"args",
        "kwargs", "options"}``.

    Raises:
        ConfigurationError: ``task`` is none of those, or a signature carries an option
            other than queue, routing_key, exchange, priority, countdown, expires,
            time_limit, soft_time_limit.

    .. versionadded:: 0.3
    """
    options: dict[str, Any] = {}
    if isinstance(task, Mapping) and "task" in task:  # a Signature (a dict subclass)
        args = (*task.get("args", ()), *args)
        kwargs = {**task.get("kwargs", {}), **kwargs}
        options = {k: v for k, v in dict(task.get("options", {})).items() if v is not None}
        name = str(task["task"])
    else:
        name = _name_of(task)
    unknown = sorted(set(options) - OPTIONS)
    if unknown:
        raise ConfigurationError(
            f"enqueue() cannot carry the option(s) {', '.join(unknown)} through the outbox "
            f"(supported: {', '.join(sorted(OPTIONS))})"
        )
    return TOPIC_PREFIX + name, {"args": list(args), "kwargs": kwargs, "options": options}


@overload
def enqueue(tx: AsyncTx, task: Any, *args: Any, **kwargs: Any) -> Awaitable[str]: ...
@overload
def enqueue(tx: Tx, task: Any, *args: Any, **kwargs: Any) -> str: ...
def enqueue(tx: Tx | AsyncTx, task: Any, *args: Any, **kwargs: Any) -> str | Awaitable[str]:
    """Write ``task(*args, **kwargs)`` into the outbox in ``tx``'s transaction.

    The task exists if and only if the transaction commits; a relay with a
    :class:`CeleryPublisher` sends it to Celery's broker with the returned id as its
    task id. With an :class:`~onceonly.AsyncTx`, await the result.

    Args:
        tx: the handler's transaction (an inbox handler, an atomic
            :func:`idempotent_task`, an idempotent Django view's ``current_tx()``).
        task: a Celery task, its name, or a signature (see :func:`task_call`).
        *args: the task's positional arguments (JSON values).
        **kwargs: the task's keyword arguments (JSON values).

    Returns:
        The outbox message id, which becomes the Celery task id.

    Raises:
        ConfigurationError: see :func:`task_call`; the store has no outbox.
        EncodingError, TooLarge: the arguments cannot be stored.

    .. versionadded:: 0.3
    """
    topic, payload = task_call(task, *args, **kwargs)
    return tx.publish(topic, payload)


class CeleryPublisher:
    """Sends outbox rows written by :func:`enqueue` as Celery tasks (for a ``Relay``).

    Args:
        app: the Celery app whose broker, routes and serializer to use. On RabbitMQ set
            ``broker_transport_options={"confirm_publish": True}`` so a send returns
            only once the broker confirmed it.
        others: the publisher of the outbox's other rows (events written with
            ``tx.publish``), so one relay serves both; without it such a row is
            refused (:class:`~onceonly.PublishError`).

    Sends are not retried here (the relay retries the row with backoff), but opening a
    connection follows kombu's connection retries (``broker_transport_options``
    ``max_retries``, ``interval_start``, …): keep them short for a relay.

    The task id is the outbox row's id. Errors reaching the broker are
    :class:`~onceonly.BrokerUnavailable` (the relay postpones the row without counting
    an attempt); any other refusal is a :class:`~onceonly.PublishError`.

    .. versionadded:: 0.3
    """

    def __init__(self, app: Any, *, others: Publisher | None = None) -> None:
        self.app = app
        self.others = others

    def connect(self) -> None:
        """Check the broker (and ``others``) answers (a relay does at start-up).

        Raises:
            BrokerUnavailable: the broker cannot be reached or refused the login.
        """
        connect = getattr(self.others, "connect", None)
        if connect is not None:
            connect()
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0)
        except (OperationalError, OSError) as exc:
            raise BrokerUnavailable(f"cannot reach Celery's broker: {exc!r}") from exc

    def publish(self, message: OutboxMessage) -> None:
        """Send a ``celery:<task name>`` row as that task with task id ``message.id``;
        hand any other row to ``others``.

        Raises:
            PublishError: the row is not a task call (and there is no ``others``), or
                the broker refused it.
            BrokerUnavailable: the broker could not be reached.
        """
        if not message.topic.startswith(TOPIC_PREFIX):
            if self.others is None:
                raise PublishError(
                    f"outbox row {message.id} (topic {message.topic!r}) is not a Celery task;"
                    " give CeleryPublisher(others=...) a publisher for the other rows",
                    key=message.id,
                )
            self.others.publish(message)
            return
        name = message.topic[len(TOPIC_PREFIX) :]
        try:
            payload = message.decoded()
            args, kwargs = list(payload["args"]), dict(payload["kwargs"])
            options = {k: v for k, v in dict(payload.get("options") or {}).items() if k in OPTIONS}
        except (ValueError, KeyError, TypeError) as exc:
            raise PublishError(
                f"outbox row {message.id} is not a task call written by enqueue()", key=message.id
            ) from exc
        try:
            self.app.send_task(
                name,
                args=args,
                kwargs=kwargs,
                task_id=message.id,
                add_to_parent=False,
                retry=False,
                **options,
            )
        except (OperationalError, OSError) as exc:
            raise BrokerUnavailable(f"cannot send task {name!r}: {exc!r}", key=message.id) from exc
        except Exception as exc:
            raise PublishError(f"Celery refused task {name!r}: {exc!r}", key=message.id) from exc

    def close(self) -> None:
        """Close ``others``. The Celery connections are the app's (kombu pools them per
        broker URL, shared with every other user of the app in this process)."""
        if self.others is not None:
            self.others.close()


class AsyncCeleryPublisher:
    """:class:`CeleryPublisher` for an ``AsyncRelay``: each Celery send runs in a
    thread; ``others`` is an async publisher.

    .. versionadded:: 0.3
    """

    def __init__(self, app: Any, *, others: AsyncPublisher | None = None) -> None:
        self.sync = CeleryPublisher(app)
        self.others = others

    async def connect(self) -> None:
        """See :meth:`CeleryPublisher.connect`."""
        connect = getattr(self.others, "connect", None)
        if connect is not None:
            await connect()
        await asyncio.to_thread(self.sync.connect)

    async def publish(self, message: OutboxMessage) -> None:
        """See :meth:`CeleryPublisher.publish`."""
        if self.others is not None and not message.topic.startswith(TOPIC_PREFIX):
            await self.others.publish(message)
            return
        await asyncio.to_thread(self.sync.publish, message)

    async def close(self) -> None:
        """See :meth:`CeleryPublisher.close`."""
        if self.others is not None:
            await self.others.close()
