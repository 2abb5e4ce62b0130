"""The error of program extraction and its stable reason codes (see :mod:`spadekit.envs.extract`).

Its own module so that :mod:`spadekit.envs.program` (whose syntax error is an
``ExtractionError``) and :mod:`spadekit.envs.extract` (which builds ``EnvProgram`` objects) do
not import each other. Standard library only: sandbox workers import this package.
"""

from __future__ import annotations

__all__ = ["REASONS", "ExtractionError"]

#: Stable ``ExtractionError.reason`` codes.
REASONS: tuple[str, ...] = (
    "empty",
    "no_code",
    "no_env_class",
    "multiple_env_classes",
    "syntax_error",
)


class ExtractionError(ValueError):
    """No usable program in the text.  ``reason`` is a stable code from :data:`REASONS`,
    ``message`` (also ``str(err)``) a human explanation."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(reason, message)
        self.reason = reason
        self.message = message

    def __str__(self) -> str:
        return self.message
