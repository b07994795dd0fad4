"""``python -m glaref`` is the ``glaref`` command."""

import sys

from .cli import main

sys.exit(main())
