"""Kiln: raw text to trained, evaluated, exported language models."""

__version__ = "0.1.0"
