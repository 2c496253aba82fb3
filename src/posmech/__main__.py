"""``python -m posmech …``: see :mod:`posmech.cli`."""

import sys

from posmech.cli import main

sys.exit(main())
