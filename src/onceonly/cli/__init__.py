# SPDX-License-Identifier: MIT
"""The ``onceonly`` command line: ``main`` parses the arguments and runs one command."""

from __future__ import annotations

from onceonly.cli._main import COMMANDS, EXIT_STATUSES, Command, CommandError, build_parser, main

__all__ = [
    "COMMANDS",
    "Command",
    "CommandError",
    "EXIT_STATUSES",
    "build_parser",
    "main",
]
