"""One line on stderr for a compile that takes long: a first gradient that compiles its
adjoint kernels for half a minute in silence looks hung.

>>> import time
>>> with compiling("demo_kernel", after_s=10.0):   # quick: says nothing
...     time.sleep(0.01)
"""

from __future__ import annotations

import sys
import threading
from typing import Any

DELAY_S = 1.0


class compiling:
    """``with compiling(name):`` prints ``tapegrad: compiling NAME (first use; cached
    afterwards)`` to stderr once the body has run ``after_s`` seconds (a timer thread: Numba's
    compiler lets other threads run), and nothing for a quicker body."""

    def __init__(self, name: str, after_s: float = DELAY_S):
        self.name = name
        self.timer = threading.Timer(after_s, self.say)
        self.timer.daemon = True

    def say(self) -> None:
        print(f"tapegrad: compiling {self.name} (first use; cached afterwards)",
              file=sys.stderr, flush=True)

    def __enter__(self) -> compiling:
        self.timer.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.timer.cancel()
        self.timer.join()    # (ended here, not later: a finished launch leaves no thread)
