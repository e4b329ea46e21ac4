"""``python -m oodeval``: the ``oodeval`` command."""

import sys

from .cli import main

sys.exit(main())
