"""Dense-CRF MAP inference: permutohedral filtering, mean-field, QP (Frank-Wolfe), DC-neg, PROX-LP.

Reported energies follow one convention: the integer energy of the labelling over ordered pairs
``a != b`` with un-normalised kernels (see :mod:`crf.energy`).
"""

from crf.api import DenseCRF, MapResult
from crf.errors import (
    ConfigError,
    CRFInputError,
    InputFileError,
    InvalidValueError,
    OutputPathError,
    ShapeMismatchError,
    TooManyLabelsError,
)
from crf.unary import MAX_LABELS, labels_from_annotation, unary_from_labels, unary_from_probs

__all__ = [
    "MAX_LABELS",
    "CRFInputError",
    "ConfigError",
    "DenseCRF",
    "InputFileError",
    "InvalidValueError",
    "MapResult",
    "OutputPathError",
    "ShapeMismatchError",
    "TooManyLabelsError",
    "labels_from_annotation",
    "unary_from_labels",
    "unary_from_probs",
]
