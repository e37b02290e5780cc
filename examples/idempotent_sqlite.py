# SPDX-License-Identifier: MIT
"""The README's @idempotent quick start, runnable: python examples/idempotent_sqlite.py."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import onceonly


@dataclass(frozen=True)
class Order:
    id: str
    total: int


class FakeProvider:
    """Stands in for a payment provider that accepts an idempotency key."""

    def __init__(self) -> None:
        self.charges: dict[str, int] = {}

    def charge(self, amount: int, idempotency_key: str) -> str:
        self.charges.setdefault(idempotency_key, amount)
        return f"pay_{len(self.charges)}"


def main(path: str) -> None:
    store = onceonly.open_store(f"sqlite:///{path}")
    store.migrate()
    provider = FakeProvider()

    @onceonly.idempotent(
        store, key=lambda order: f"charge:{order.id}", scope="billing.charge", ttl=timedelta(days=7)
    )
    def charge(order: Order) -> dict[str, str]:
        claim = onceonly.current_claim()
        if "charged" not in claim.checkpoints:  # resume after a crash
            payment = provider.charge(order.total, idempotency_key=claim.key)
            claim.checkpoint("charged", {"payment": payment})
        return {"payment": claim.checkpoints["charged"]["payment"]}

    order = Order("o-1", 500)
    print(charge(order), charge(order), f"provider charges: {len(provider.charges)}")
    store.close()


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as d:
        main(str(Path(d) / "onceonly.db"))
