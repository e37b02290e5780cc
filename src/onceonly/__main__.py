# SPDX-License-Identifier: MIT
"""``python -m onceonly``: the same as the ``onceonly`` command."""

import sys

from onceonly.cli import main

sys.exit(main())
