"""Typed input errors of the dense-CRF package.

Every error raised on bad user input derives from :class:`CRFInputError`, itself a
``ValueError``, and its message says what is wrong and where (which argument, which shape,
which file, which index).
"""

from __future__ import annotations


class CRFInputError(ValueError):
    """Bad input to the dense-CRF API (shapes, dtypes, values, options or files)."""


class ShapeMismatchError(CRFInputError):
    """Image, unary or labelling shapes that disagree."""


class InvalidValueError(CRFInputError):
    """NaN / infinite / out-of-range values (probabilities, labels, parameters)."""


class TooManyLabelsError(InvalidValueError):
    """More labels (annotation colours, probability channels) than :data:`crf.unary.MAX_LABELS`."""


class ConfigError(CRFInputError):
    """A solver configuration field out of its valid range, or an unknown option string."""


class InputFileError(CRFInputError):
    """An input file that is missing, a directory, unreadable, of the wrong format or too large."""


class OutputPathError(CRFInputError):
    """An output path whose folder does not exist, is not writable, or has an unknown suffix."""
