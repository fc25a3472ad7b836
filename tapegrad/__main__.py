"""``python -m tapegrad demo|bench``."""

import sys

from tapegrad.cli import main

sys.exit(main())
