# SPDX-License-Identifier: MIT
"""``python -m chaos``: see :mod:`chaos.cli`."""

import sys

from chaos.cli import main

sys.exit(main())
