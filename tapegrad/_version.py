"""The version, in one place below every other module (the cache folder is named after it)."""

__version__ = "0.1.0"
