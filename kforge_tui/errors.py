"""Errors that reach the user as one line and an exit code (DESIGN.md: 0 ok, 1 work failed, 2 bad input)."""
from __future__ import annotations


class KforgeError(Exception):
    """Base class: `str(err)` is the one-line message shown to the user."""

    exit_code = 1


class UsageError(KforgeError):
    """Bad usage or bad input: missing file, model that raises, unknown op, bad flag (exit 2)."""

    exit_code = 2


class WorkFailed(KforgeError):
    """The work ran but failed: nothing verified, end-to-end mismatch (exit 1)."""

    exit_code = 1
