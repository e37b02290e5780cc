# SPDX-License-Identifier: MIT
"""enqueue(), CeleryPublisher and idempotent_task's configuration, without a worker.

The message check reads what CeleryPublisher sent through kombu's in-memory
transport (a real kombu channel, no broker process): Celery's protocol v2 with the
outbox id as the task id.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import onceonly
from onceonly.contrib.celery import CeleryPublisher, enqueue, idempotent_task, task_call
from onceonly.messaging import OutboxMessage
from onceonly.testing import ListPublisher


@pytest.fixture
def app() -> Celery:
    app = Celery("enqueue-test", broker="memory://")
    # kombu's memory transport is one per process: a queue of this test's own
    app.conf.task_default_queue = f"jobs-{uuid.uuid4().hex}"

    @app.task(name="t.send", shared=False)
    def send(to: str, subject: str = "") -> None: ...

    return app


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    store = onceonly.open_store(f"sqlite:///{tmp_path}/s.db", migrate=True)
    yield store
    store.close()


def _received(app: Celery, queue: str) -> Any:
    with app.connection_for_read() as conn:
        q = conn.SimpleQueue(queue)
        try:
            return q.get(timeout=1)
        finally:
            q.close()


def test_task_call_takes_a_task_a_name_or_a_signature(app: Celery) -> None:
    """Arguments of a signature come first; its routing options are kept."""
    send = app.tasks["t.send"]
    assert task_call(send, "a@x", subject="hi") == (
        "celery:t.send",
        {"args": ["a@x"], "kwargs": {"subject": "hi"}, "options": {}},
    )
    assert task_call("t.send", "a@x")[0] == "celery:t.send"
    topic, payload = task_call(send.s("a@x").set(queue="mail", priority=3), subject="s")
    assert topic == "celery:t.send"
    assert payload == {
        "args": ["a@x"],
        "kwargs": {"subject": "s"},
        "options": {"queue": "mail", "priority": 3},
    }


def test_options_that_cannot_travel_are_refused(app: Celery) -> None:
    """link= (a callback) is not carried through the outbox: refused, not dropped."""
    send = app.tasks["t.send"]
    with pytest.raises(onceonly.ConfigurationError, match="link"):
        task_call(send.s("a@x").set(link=send.s("b@x")))
    with pytest.raises(onceonly.ConfigurationError, match="Celery task"):
        task_call(42)


def test_enqueue_writes_a_row_in_the_transaction_and_the_relay_sends_protocol_v2(
    app: Celery, store: Any
) -> None:
    """The row commits with the handler; the message is a Celery v2 task with its id."""
    inbox = onceonly.Inbox(store, consumer="signup")

    def handler(user: dict[str, str], tx: onceonly.Tx) -> str:
        return enqueue(tx, app.tasks["t.send"], user["email"], subject="welcome")

    task_id = inbox.process("u1", {"email": "a@x"}, handler).result
    assert onceonly.Relay(store, CeleryPublisher(app)).run_once().published == 1
    message = _received(app, app.conf.task_default_queue)
    assert message.content_type == "application/json"
    assert message.headers["id"] == task_id == message.properties["correlation_id"]
    assert message.headers["task"] == "t.send"
    assert message.headers["lang"] == "py"
    assert message.headers["argsrepr"] == "['a@x']"
    args, kwargs, embed = json.loads(message.body)
    assert (args, kwargs) == (["a@x"], {"subject": "welcome"})
    assert set(embed) >= {"callbacks", "errbacks", "chain", "chord"}


def test_a_rolled_back_transaction_enqueues_nothing(app: Celery, store: Any) -> None:
    """The dual write it replaces: no commit, no task."""
    inbox = onceonly.Inbox(store, consumer="signup")

    def handler(user: dict[str, str], tx: onceonly.Tx) -> None:
        enqueue(tx, "t.send", user["email"])
        raise RuntimeError("the business write failed")

    with pytest.raises(RuntimeError):
        inbox.process("u2", {"email": "b@x"}, handler)
    assert onceonly.Outbox(store).counts()["pending"] == 0


def test_a_row_that_is_not_a_task_call_is_refused(app: Celery) -> None:
    """A PublishError (counted by the relay), not a crash of the relay."""
    with pytest.raises(onceonly.PublishError) as info:
        CeleryPublisher(app).publish(OutboxMessage(id="m1", topic="celery:t", payload='"x"'))
    assert not isinstance(info.value, onceonly.BrokerUnavailable)


def test_one_relay_sends_tasks_to_celery_and_events_to_their_publisher(
    app: Celery, store: Any
) -> None:
    """Rows written by tx.publish go to ``others``; without it they are refused."""
    inbox = onceonly.Inbox(store, consumer="signup")

    def handler(user: dict[str, str], tx: onceonly.Tx) -> str:
        tx.publish("users.created", {"email": user["email"]})
        return enqueue(tx, "t.send", user["email"])

    task_id = inbox.process("u3", {"email": "c@x"}, handler).result
    refused = onceonly.Relay(store, CeleryPublisher(app), backoff_base=0.01, backoff_cap=0.01)
    assert refused.run_once().failed == 1  # the event: no publisher for it
    _received(app, app.conf.task_default_queue)  # the task went
    events = ListPublisher()
    time.sleep(0.05)  # past the refused row's backoff
    stats = onceonly.Relay(store, CeleryPublisher(app, others=events)).run_once()
    assert stats.published == 1
    [event] = events.messages
    assert event.topic == "users.created" and event.id != task_id


def test_an_unreachable_broker_is_transient() -> None:
    """BrokerUnavailable: the relay postpones the row without counting an attempt."""
    app = Celery("down", broker="amqp://guest:guest@127.0.0.1:1//")
    app.conf.broker_connection_timeout = 0.5
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}
    publisher = CeleryPublisher(app)
    with pytest.raises(onceonly.BrokerUnavailable):
        publisher.connect()
    topic, payload = task_call("t.send")
    message = OutboxMessage(id="m2", topic=topic, payload=json.dumps(payload))
    with pytest.raises(onceonly.BrokerUnavailable):
        publisher.publish(message)
    publisher.close()


def test_configuration_errors(app: Celery, store: Any, tmp_path: Path) -> None:
    """Atomic needs a transaction and a tx parameter; a direct call has no task id."""
    redis_like = onceonly.open_store("memory://")
    redis_like.atomic = False  # a store that cannot hold a transaction
    with pytest.raises(onceonly.ConfigurationError, match="transaction"):
        idempotent_task(redis_like, atomic=True)
    with pytest.raises(onceonly.ConfigurationError, match="must take tx"):
        idempotent_task(store, atomic=True)(lambda: None)

    async def coroutine() -> None: ...

    with pytest.raises(onceonly.ConfigurationError, match="async"):
        idempotent_task(store)(coroutine)
    async_store = onceonly.open_async_store("memory://")
    with pytest.raises(onceonly.ConfigurationError, match="sync"):
        idempotent_task(async_store)

    @app.task(name="t.direct", shared=False)
    @idempotent_task(store)
    def direct(x: int) -> int:
        return x

    with pytest.raises(onceonly.ConfigurationError, match="without a task id"):
        direct(1)

    @app.task(name="t.keyed", shared=False)
    @idempotent_task(store, key=lambda x: f"k{x}")
    def keyed(x: int) -> int:
        return x

    assert keyed(5) == 5
    assert keyed.apply(args=[5]).get() == 5  # eager, another task id, same key: replayed


def test_celery_checks_an_atomic_tasks_arguments_without_tx(app: Celery, store: Any) -> None:
    """Celery's call check sees the function's signature, without ``tx`` (after ``self``
    if bound) for atomic tasks."""

    @app.task(name="t.atomic", shared=False)
    @idempotent_task(store, atomic=True)
    def atomic(tx: onceonly.Tx, order_id: str, amount: int = 0) -> None: ...

    @app.task(name="t.bound", shared=False, bind=True)
    @idempotent_task(store, atomic=True)
    def bound(self: Any, tx: onceonly.Tx, order_id: str) -> None: ...

    @app.task(name="t.leased_check", shared=False)
    @idempotent_task(store)
    def leased(order_id: str) -> None: ...

    with pytest.raises(TypeError):
        leased.apply_async(args=[])
    atomic.apply_async(args=["o1"], kwargs={"amount": 2})
    bound.apply_async(args=["o1"])
    with pytest.raises(TypeError):
        atomic.apply_async(args=[])
    with pytest.raises(TypeError):
        bound.apply_async(args=["o1", "extra"])


def test_an_eager_atomic_task_runs_once_per_task_id(app: Celery, store: Any) -> None:
    """apply() with a task id twice: the second replays; a bound task gets self and tx."""
    runs: list[tuple[str, int]] = []

    @app.task(name="t.eager", shared=False, bind=True)
    @idempotent_task(store, atomic=True)
    def eager(self: Any, tx: onceonly.Tx, n: int) -> dict[str, Any]:
        runs.append((self.request.id, tx.attempt))
        return {"n": n, "key": tx.key}

    first = eager.apply(args=[1], task_id="tid-1").get()
    again = eager.apply(args=[1], task_id="tid-1").get()
    assert first == again == {"n": 1, "key": "tid-1"}
    assert runs == [("tid-1", 1)]
    with pytest.raises(onceonly.PayloadMismatch):
        eager.apply(args=[2], task_id="tid-1").get()
