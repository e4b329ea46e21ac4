"""oodeval: exact, reproducible OOD-detection evaluation and OOD benchmark construction."""

__version__ = "0.1.0"
