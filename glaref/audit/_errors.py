"""The audit's two kinds of refusal, which the CLI maps to exit codes 2 and 3."""

from __future__ import annotations

from .._errors import GlarefError


class AuditUsageError(GlarefError, ValueError):
    """A bad argument: unknown preset, config, kernel spec, mode, dtype... (CLI exit code 2)."""


class AuditEnvironmentError(GlarefError, RuntimeError):
    """Something missing from this machine: jax, a backend, matplotlib... (CLI exit code 3)."""
