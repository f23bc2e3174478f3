"""``python -m basecap`` (used by ``torchrun -m basecap train ...``)."""

import sys

from .cli import main

sys.exit(main())
