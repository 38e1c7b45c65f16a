"""Errors of the public API (re-exports those of `bounds`, adds specification errors)."""

from __future__ import annotations

from bounds.errors import (
    IndexOutOfTableError,
    InvalidNetworkError,
    InvalidRegionError,
    ShapeMismatchError,
    UnsupportedOperationError,
    VerificationInputError,
)


class SpecificationError(VerificationInputError):
    """A malformed VNN-LIB file or ONNX model: the message names the file and the line."""

    def __init__(self, message: str, path: str | None = None, line: int | None = None) -> None:
        self.path = path
        self.line = line
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)


class CertificateUnsupportedError(VerificationInputError):
    """A certificate was asked for with a method or splitting that cannot write one (input
    splitting by CROWN and alpha-CROWN's output slopes can, `verify.bab.input.certify`)."""


__all__ = [
    "CertificateUnsupportedError",
    "IndexOutOfTableError",
    "InvalidNetworkError",
    "InvalidRegionError",
    "ShapeMismatchError",
    "SpecificationError",
    "UnsupportedOperationError",
    "VerificationInputError",
]
