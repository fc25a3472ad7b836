"""Captured functions: record a function's launches once, replay them without its Python
(``tg.capture``; docs/capture.md)."""

from tapegrad.capturing.captured import Captured, capture

__all__ = ["Captured", "capture"]
