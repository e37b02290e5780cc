# SPDX-License-Identifier: MIT
"""``onceonly demo``: at-least-once delivery with real, crashing worker processes.

The same workload — N "charge customer X amount Y" messages, about 30 % of them sent
twice by the producer — runs through a simulated at-least-once broker
twice: once with a naive check-then-act consumer and
once with :class:`onceonly.Inbox`, while a supervisor SIGKILLs workers at random.
The charges each side left behind are then counted.

This package is the command's face; its modules are private: ``_workload`` (the
messages), ``_database`` (the database under test and its business tables),
``_broker`` (the queue), ``_consumers`` (naive and onceonly), ``_worker`` (the worker
process), ``_supervisor`` (the pool and the crashes), ``_report`` (counting, table,
progress bar), ``_runner`` (the command).
"""

from __future__ import annotations

from onceonly.demo._database import DemoError
from onceonly.demo._runner import DemoOptions, add_arguments, options_from_args, run_demo

__all__ = ["DemoError", "DemoOptions", "add_arguments", "options_from_args", "run_demo"]
