# SPDX-License-Identifier: MIT
"""``python -m onceonly.cli``: the same command line as ``onceonly``."""

from onceonly.cli import main

raise SystemExit(main())
