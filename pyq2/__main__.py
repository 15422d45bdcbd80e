"""`python -m pyq2` runs the pyq2 command line.

The signal handlers go in before pyq2.cli and its commands import numpy and gguf, so a signal
during those imports is one line and exit status 128 + N (pyq2.interrupts), not a traceback.
"""

import sys

from . import interrupts

interrupts.install()
try:
    from .cli import main

    status = main()
    interrupts.finish()
except KeyboardInterrupt as e:
    interrupts.finish()
    status = interrupts.report(e)
sys.exit(status)
