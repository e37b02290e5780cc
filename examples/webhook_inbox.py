# SPDX-License-Identifier: MIT
"""Receiving webhooks once: python examples/webhook_inbox.py [DB].

GitHub names each delivery in the ``X-GitHub-Delivery`` header and redelivers with the
same id: the HTTP middleware takes that header as the idempotency key, so a redelivery
gets the first answer back without running the handler. Stripe puts the event id in the
body (``evt_...``; the ``Stripe-Signature`` header changes on every retry): the handler
hands it to an inbox, whose claim commits in one transaction with the handler's writes.
Verify the provider's signature before trusting either (left out here).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

from flask import Flask, jsonify, request

import onceonly
from onceonly.http import HttpPolicy
from onceonly.http.flask import OnceOnly, idempotency


def make_app(store: Any) -> Flask:
    app = Flask(__name__)
    with store.transaction() as tx:
        tx.execute("CREATE TABLE IF NOT EXISTS events (source TEXT, id TEXT)")
    stripe_inbox = onceonly.Inbox(store, consumer="stripe-webhooks")

    @app.post("/webhooks/github")
    @idempotency("required")
    def github() -> Any:
        with store.transaction() as tx:
            tx.execute(
                "INSERT INTO events VALUES (?, ?)", ("github", request.headers["X-GitHub-Delivery"])
            )
        return jsonify({"received": True})

    @app.post("/webhooks/stripe")
    @idempotency("off")  # keyed by the event id in the body, below
    def stripe() -> Any:
        event = request.get_json()

        def handle(evt: dict[str, Any], tx: onceonly.Tx) -> dict[str, str]:
            tx.execute("INSERT INTO events VALUES (?, ?)", ("stripe", evt["id"]))
            return {"handled": evt["type"]}

        outcome = stripe_inbox.process(event["id"], event, handle)
        return jsonify({**outcome.result, "replayed": outcome.replayed})

    OnceOnly(
        app,
        store=store,
        # the webhook's sender, once its signature is verified: one provider, one scope
        principal=lambda req: "github",
        policy=HttpPolicy(header="X-GitHub-Delivery"),
    )
    return app


def main(path: str) -> None:
    store = onceonly.open_store(f"sqlite:///{path}", migrate=True)
    client = make_app(store).test_client()
    delivery = {"X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    for attempt in ("first", "redelivery"):
        r = client.post("/webhooks/github", json={"action": "opened"}, headers=delivery)
        print(f"github {attempt}: {r.status_code} replayed={'Idempotent-Replayed' in r.headers}")
    event = {"id": "evt_1", "type": "payment_intent.succeeded"}
    for attempt in ("first", "retry"):
        r = client.post("/webhooks/stripe", json=event, headers={"Stripe-Signature": attempt})
        print(f"stripe {attempt}: {r.get_json()}")
    with store.session() as s:
        rows = s.execute("SELECT source, count(*) FROM events GROUP BY source ORDER BY source")
        print("events:", dict(rows.fetchall()))
    store.close()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with tempfile.TemporaryDirectory() as d:
            main(str(Path(d) / "onceonly.db"))
