# SPDX-License-Identifier: MIT
"""The chaos harness: onceonly's whole pipeline under faults, then an invariant check.

Producers place orders through an atomic inbox and write their messages to an outbox
(about ``--duplicates`` of them twice, with the same id); relays publish the outboxes
to RabbitMQ; consumers run an atomic inbox whose handler writes one ``effects`` row per
message. Meanwhile processes are SIGKILLed, their PostgreSQL backends terminated and
the run's own PostgreSQL cluster restarted with ``-m immediate``. Once everything has
quiesced, the checker counts ``lost``, ``doubled`` and ``stuck`` messages.

Modules: ``spec`` (names and parameters shared by every process), ``pgcluster`` (the
private PostgreSQL), ``worker`` (producer, relay and consumer processes),
``supervisor`` (the process pool and its restarts), ``faults`` (the injector),
``monitor`` (progress samples), ``checker`` (the invariants), ``run`` (the phases),
``report`` (the summary), ``cli`` (``python -m chaos``). See ``docs/chaos.md``.

This package is a test harness, not part of the library: it lives outside ``src/``
and is not installed.
"""
