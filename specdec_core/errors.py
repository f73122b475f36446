"""The error a caller's bad input raises, shared by every room: the CLI prints it as one line, the app in plain
words. (Errors that belong to one subject stay with it: models.ModelError, drafters.DrafterUnavailable.)"""
from __future__ import annotations


class InputError(ValueError):
    """Bad user input: the message says exactly what is wrong and what is allowed."""
