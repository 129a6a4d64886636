"""The one error type every quantized-format check raises."""

from __future__ import annotations

from colibri.reference.errors import CheckpointError


class QuantFormatError(CheckpointError):
    """A tensor's bytes break a rule of its quantized format.

    The message always names the tensor and the rule, because a container is untrusted input
    and the reader refuses it rather than guess (colibri's ``qt_resolve_fmt`` posture).
    """

    def __init__(self, tensor: str, rule: str) -> None:
        super().__init__(f"{tensor}: {rule}")
        self.tensor = tensor
        self.rule = rule
