# SPDX-License-Identifier: MIT
"""``onceonly demo``: at-least-once delivery with real, crashing worker processes.

The same workload — N "charge customer X amount Y" messages, about 30 % of them sent
twice by the producer — runs through a simulated at-least-once broker
(:mod:`~onceonly.demo.broker`) twice: once with a naive check-then-act consumer and
once with :class:`onceonly.Inbox`, while a supervisor SIGKILLs workers at random.
The charges each side left behind are then counted (:mod:`~onceonly.demo.report`).

Modules: ``workload`` (the messages), ``database`` (the database under test and its
business tables), ``broker`` (the queue), ``consumers`` (naive and onceonly),
``worker`` (the worker process), ``supervisor`` (the pool and the crashes),
``report`` (counting, table, progress bar), ``runner`` (the command).
"""

from __future__ import annotations

from onceonly.demo.database import DemoError
from onceonly.demo.runner import DemoOptions, add_arguments, options_from_args, run_demo

__all__ = ["DemoError", "DemoOptions", "add_arguments", "options_from_args", "run_demo"]
