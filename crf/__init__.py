"""Dense-CRF MAP inference: permutohedral filtering, mean-field, QP (Frank-Wolfe), DC-neg, PROX-LP.

Reported energies follow one convention: the integer energy of the labelling over ordered pairs
``a != b`` with un-normalised kernels (see :mod:`crf.energy`).
"""

from crf.api import DenseCRF, MapResult
from crf.errors import ConfigError, CRFInputError, InvalidValueError, ShapeMismatchError
from crf.unary import labels_from_annotation, unary_from_labels, unary_from_probs

__all__ = [
    "CRFInputError",
    "ConfigError",
    "DenseCRF",
    "InvalidValueError",
    "MapResult",
    "ShapeMismatchError",
    "labels_from_annotation",
    "unary_from_labels",
    "unary_from_probs",
]
