"""Shared: the two error families and the documented exit codes.

`OpscanError` subclasses are the user's problem (bad target, bad flags, a model that fails on the
given inputs): the CLI prints their one-line message and exits 2. Anything else is a bug in opscan:
traceback, a request to report it, exit 3.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Process exit codes (documented in the README)."""

    OK = 0
    FINDINGS = 1
    USAGE = 2
    INTERNAL = 3


class OpscanError(Exception):
    """A user-facing error: one line saying what is wrong and how to fix it. `api`: the same line for a Python
    caller (opscan.analyze), when the fix names command-line flags (`--input`, `-v`)."""

    def __init__(self, message: str, *, user_traceback: str | None = None, api: str | None = None):
        super().__init__(message)
        self.user_traceback = user_traceback
        self.api = api

    def for_api(self) -> OpscanError:
        """The error as a Python caller reads it: its `api` line when it has one (same type and traceback)."""
        if self.api is None:
            return self
        return type(self)(self.api, user_traceback=self.user_traceback)


class UsageError(OpscanError):
    """Malformed command-line arguments (`--input`, `--arg`, ...)."""


class TargetError(OpscanError):
    """The TARGET could not be loaded or did not return what the contract asks for."""


class StepError(OpscanError):
    """The user's training step raised while it was being traced."""


class OutputError(OpscanError):
    """The report folder could not be written."""
