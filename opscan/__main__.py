"""Entry point for `python -m opscan`."""

import sys

from opscan.cli import main

sys.exit(main())
