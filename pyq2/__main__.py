"""`python -m pyq2` runs the pyq2 command line.

The signal handlers go in before pyq2.cli and its commands import numpy and gguf, so a signal
during those imports is one line and exit status 128 + N (pyq2.interrupts), not a traceback.
"""

import sys

from . import interrupts
from .errors import Interrupted

try:
    interrupts.install()  # inside the try: a signal may come while the handlers go in
    from .cli import main

    status = main()
    interrupts.finish()
except KeyboardInterrupt as e:
    interrupts.finish()
    status = interrupts.report(e)
except Exception:  # an import that a signal cut can fail with another exception (numpy's)
    signum = interrupts.caught()
    if signum is None:
        raise
    interrupts.finish()
    status = interrupts.report(Interrupted(signum))
sys.exit(status)
