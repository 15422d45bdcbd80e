"""`python -m pyq2` runs the pyq2 command line."""

import sys

from .cli import main

sys.exit(main())
