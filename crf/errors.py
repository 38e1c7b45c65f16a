"""Typed input errors of the dense-CRF package.

Every error raised on bad user input derives from :class:`CRFInputError`, itself a
``ValueError``, and its message says what is wrong and where (which argument, which shape).
"""

from __future__ import annotations


class CRFInputError(ValueError):
    """Bad input to the dense-CRF API (shapes, dtypes, values or options)."""


class ShapeMismatchError(CRFInputError):
    """Image, unary or labelling shapes that disagree."""


class InvalidValueError(CRFInputError):
    """NaN / infinite / out-of-range values (probabilities, labels, parameters)."""


class ConfigError(CRFInputError):
    """A solver configuration field out of its valid range, or an unknown option string."""
