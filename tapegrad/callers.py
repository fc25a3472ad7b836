"""Where the user is: the innermost caller outside tapegrad, as ``file:line``.

What an error or a record names when it points at the user's code (a captured call's steps,
a verified tape's launches): tapegrad's own frames and generated code (``<string>``, a
dataclass's ``__init__``) are skipped.
"""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def tapegrads(filename: str) -> bool:
    """Whether code in ``filename`` is tapegrad's: its package, or code it generated
    (``<tapegrad recorder of ...>``, ``<tapegrad launch plan ...>``)."""
    return filename.startswith(_PACKAGE) or filename.startswith("<tapegrad")


def user_line() -> str:
    """``file:line`` of the innermost caller outside tapegrad ('' if there is none)."""
    frame = sys._getframe(1)
    # (any generated code counts as tapegrad's here: a dataclass's ``__init__`` is <string>)
    while frame is not None and (tapegrads(frame.f_code.co_filename)
                                 or frame.f_code.co_filename.startswith("<")):
        frame = frame.f_back
    if frame is None:
        return ""
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
