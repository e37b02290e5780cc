# SPDX-License-Identifier: MIT
"""The one-screen summary of a chaos run, and its JSON form.

Counters taken from the workers' status files (deliveries, publishes) are marked
``~``: a SIGKILLed process's last status is up to 0.2 s old. Everything the verdict
rests on (orders, effects, records, outbox rows, queues) is counted in the database
and on the broker after the run.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any

from chaos.checker import Findings
from chaos.kafka import PARTITIONS
from chaos.run import Result
from chaos.spec import ECHO_OUTBOX, OUTBOX

__all__ = ["render", "to_json"]

MAX_EXAMPLES = 3


def _n(value: int) -> str:
    return f"{value:,}"


def _rate(count: int, seconds: float | None) -> str:
    return f"{count / seconds:,.0f}/s" if seconds else "-"


def _clock(at: float) -> str:
    return dt.datetime.fromtimestamp(at).strftime("%H:%M:%S.%f")[:-3]


def _faults_line(r: Result) -> str:
    kills = ", ".join(f"{role} {n}" for role, n in sorted(r.kills.items()))
    parts = [f"sigkill {r.faults.get('sigkill', 0)}" + (f" ({kills})" if kills else "")]
    rounds = r.faults.get("pg_terminate_backend", 0)
    parts.append(f"pg_terminate_backend {rounds} rounds ({r.backends_terminated} backends)")
    restarts = r.faults.get("pg_restart", 0)
    avg = f", {r.restart_seconds / restarts:.2f}s each" if restarts else ""
    parts.append(f"pg_restart {restarts}{avg}")
    return "; ".join(parts)


def _exits_line(r: Result) -> str:
    if not r.exits:
        return "none"
    parts = []
    for role, reasons in sorted(r.exits.items()):
        detail = ", ".join(f"{why} {n}" for why, n in sorted(reasons.items(), key=lambda x: -x[1]))
        parts.append(f"{role} {sum(reasons.values())} ({detail})")
    return "; ".join(parts)


def _consumed_line(counts: dict[str, int]) -> str:
    c = Counter(counts)
    errors = {k: n for k, n in c.items() if k.startswith(("store-error", "handler-error"))}
    total = c["processed"] + c["replayed"] + c["in-flight"] + sum(errors.values())
    total += c["dead-lettered"] + c["payload-mismatch"]
    ranked = sorted(errors.items(), key=lambda x: -x[1])
    kinds = ", ".join(f"{k.replace('-error:', ' ')} {_n(n)}" for k, n in ranked)
    return (
        f"~{_n(total)} inbox calls: {_n(c['processed'])} processed, {_n(c['replayed'])}"
        f" replayed, {_n(c['in-flight'])} in flight, {_n(sum(errors.values()))} errors"
        + (f" ({kinds})" if kinds else "")
        + f", {_n(c['dead-lettered'] + c['payload-mismatch'])} dead"
    )


def _relayed_line(counts: dict[str, int]) -> str:
    c = Counter(counts)
    main, echo = c[f"{OUTBOX}:published"], c[f"{ECHO_OUTBOX}:published"]
    failed = c[f"{OUTBOX}:failed"] + c[f"{ECHO_OUTBOX}:failed"]
    return (
        f"~{_n(main + echo)} publishes confirmed ({_n(main)} + {_n(echo)} echo, counting the"
        f" rows a killed relay published again), {_n(failed)} failed publishes (retried)"
    )


def _examples(r: Result, f: Findings) -> list[str]:
    lines: list[str] = []
    groups = (
        ("doubled", sorted(f.doubled_effects)),
        ("lost", sorted(f.lost)),
        ("stuck", sorted(f.stuck)),
    )
    for label, ids in groups:
        for mid in ids[:MAX_EXAMPLES]:
            info = r.examples.get(mid, {})
            order = info.get("order", {})
            head = f"  {label} {mid}"
            if order:
                head += f" (order {order.get('request')} at {_clock(order['at'])})"
            if label == "stuck":
                head += ": " + "; ".join(f.stuck[mid])
            elif label == "lost":
                head += ": " + f.lost[mid]
            lines.append(head)
            for e in info.get("effects", []):
                lines.append(
                    f"    effect at {_clock(e['at'])} by {e['consumer']} attempt {e['attempt']}"
                    f" delivery #{e['delivery_count']} redelivered={e['redelivered']}"
                )
            rec = info.get("record")
            if rec:
                lines.append(
                    f"    record {rec['state']} attempts {rec['attempts']} updated"
                    f" {_clock(rec['updated_at'])}: {rec['error'] or '-'}"
                )
            times = [e["at"] for e in info.get("effects", [])]
            if rec:
                times.append(rec["updated_at"])
            if times:
                until = max(times)
                near = [e for e in r.fault_log if until - 10 <= e["at"] <= until]
                for e in near[-4:]:
                    lines.append(
                        f"    fault {until - e['at']:.1f}s before: {e['kind']} {e['detail']}"
                    )
            elif order:  # nothing happened to it downstream: what struck after the order?
                near = [e for e in r.fault_log if order["at"] <= e["at"] <= order["at"] + 30]
                for e in near[:4]:
                    lines.append(
                        f"    fault {e['at'] - order['at']:.1f}s after the order: {e['kind']}"
                        f" {e['detail']}"
                    )
    return lines


def _overtime(r: Result) -> str:
    if r.overtime <= 0:
        return ""
    return f"; the drain ran {r.overtime:.1f}s past its planned end, progressing"


def _why_not_quiescent(r: Result) -> str:
    o = r.options
    if r.drain_end == "stalled":
        return f"nothing progressed for {o.stall:g}s after the deadline"
    if r.drain_end == "cap":
        cap = max(o.seconds, o.max_seconds or 3 * o.seconds)
        return f"still progressing at the absolute cap ({cap:g}s)"
    return "the drain did not finish"


def render(r: Result) -> str:
    """The summary: parameters, rates, faults by kind, what is left, the verdict."""
    o = r.options
    f = r.findings
    s = r.seconds
    lines = [
        f"onceonly chaos: {_n(o.messages)} messages, {o.duplicates:.0%} duplicates, seed {o.seed}",
        f"  pipeline    {o.producers} producers -> outbox + echo outbox -> {o.relays} relays ->"
        f" {'Kafka (Tansu)' if o.broker == 'kafka' else 'RabbitMQ'} -> {o.consumers} consumers"
        f" x {o.concurrency} -> effects",
        f"  time        {s.get('total', 0):.1f}s: setup {s.get('setup', 0):.1f}, faults"
        f" {s.get('faults', 0):.1f}, drain {s.get('drain', 0):.1f}, stop {s.get('stop', 0):.1f},"
        f" check {s.get('check', 0):.1f} (deadline {o.seconds:g}s{_overtime(r)})"
        + ("" if r.quiescent else f"; NOT QUIESCENT: {_why_not_quiescent(r)}"),
        f"  faults      {_faults_line(r)}",
        f"  own exits   {_exits_line(r)}",
    ]
    if o.broker == "kafka":
        lines.append(
            f"  rebalances  {r.assignments} partition assignments (the first ones included;"
            f" a rebalance reassigns all {PARTITIONS} partitions)"
        )
    if f is not None:
        produced = Counter(r.counts.get("producer", {}))
        lines += [
            f"  produced    {_n(f.orders)} orders ({_n(f.messages)} messages,"
            f" {_n(f.duplicated)} also sent again with the same id) in"
            f" {r.produced_after or 0:.1f}s = {_rate(f.orders, r.produced_after)};"
            f" ~{_n(produced['replayed'])} upstream retries replayed",
            f"  relayed     {_relayed_line(r.counts.get('relay', {}))}",
            f"  consumed    {_consumed_line(r.counts.get('consumer', {}))}",
            f"  end to end  every order had its effect after {r.consumed_after or 0:.1f}s ="
            f" {_rate(f.messages, r.consumed_after)}"
            if r.consumed_after
            else "  end to end  NOT every order got its effect",
            f"  left        outbox {_n(sum(f.outbox_left.values()))}, queue {_n(f.queue_left)},"
            f" dead letters {_n(f.dead_letters)} ({_n(f.dead_letter_duplicates)} copies of"
            " messages that have their effect); records "
            + ", ".join(f"{sc} {st} {_n(n)}" for (sc, st), n in sorted(f.records.items())),
        ]
        extra = []
        if f.phantom:
            extra.append(f"phantom {_n(sum(f.phantom.values()))}")
        if f.unproduced:
            extra.append(f"unproduced {_n(len(f.unproduced))}")
        if f.broker_errors:
            extra.append("broker unreadable: " + "; ".join(f.broker_errors))
        if r.stragglers:
            extra.append("killed at stop: " + ", ".join(r.stragglers))
        if extra:
            lines.append("  also        " + "; ".join(extra))
        lines += _examples(r, f)
        doubled = f"{_n(f.doubled)}" + (
            f" ({sum(n - 1 for n in f.doubled_orders.values())} orders)" if f.doubled_orders else ""
        )
        verdict = "OK" if r.ok else "FAILED"
        lines.append(
            f"  invariants  lost {_n(len(f.lost))}   doubled {doubled}   stuck {_n(len(f.stuck))}"
            f"   -> {verdict}"
        )
    else:
        lines.append(f"  invariants  not checked: {r.error}")
    return "\n".join(lines)


def to_json(r: Result) -> dict[str, Any]:
    """The numbers of the summary (what tests assert on)."""
    f = r.findings
    data: dict[str, Any] = {
        "ok": r.ok,
        "error": r.error,
        "seconds": r.seconds,
        "quiescent": r.quiescent,
        "drain_end": r.drain_end,
        "overtime": r.overtime,
        "faults": r.faults,
        "kills": r.kills,
        "broker": r.options.broker,
        "assignments": r.assignments,
        "backends_terminated": r.backends_terminated,
        "exits": r.exits,
        "counts": r.counts,
        "stragglers": r.stragglers,
        "produced_after": r.produced_after,
        "consumed_after": r.consumed_after,
    }
    if f is not None:
        data.update(
            messages=f.messages,
            orders=f.orders,
            duplicated=f.duplicated,
            effects=f.effects,
            lost=len(f.lost),
            doubled=f.doubled,
            stuck=len(f.stuck),
            phantom=len(f.phantom),
            unproduced=len(f.unproduced),
            lost_ids=sorted(f.lost)[:100],
            doubled_ids=sorted(f.doubled_effects)[:100],
            stuck_ids={m: f.stuck[m] for m in sorted(f.stuck)[:100]},
            queue_left=f.queue_left,
            dead_letters=f.dead_letters,
            records={f"{sc}:{st}": n for (sc, st), n in f.records.items()},
        )
    return data
