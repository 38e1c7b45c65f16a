"""Branchers by name: the branching heuristics of each splitting mode are registered classes
(`Registry.register`), chosen by name once, when a search is configured
(`Registry.get`); the configs validate their `branching` against `names()`.

- `INPUT_BRANCHINGS` (`verify.bab.input.branching`): "smear", "widest" (scores of the input
  dimensions);
- `RELU_BRANCHINGS` (`verify.bab.relu.branching`): "babsr", "fsb" (the neuron to split)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """A registry of classes by name: the branching heuristics of one splitting mode (or another
    family of strategies, `kind` in its messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._classes: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """A class decorator: register the heuristic under `name`."""

        def wrap(cls: T) -> T:
            self._classes[name] = cls
            return cls

        return wrap

    def get(self, name: str) -> T:
        """The heuristic registered as `name` (ValueError when none is)."""
        if name not in self._classes:
            raise ValueError(f"unknown {self.mode} branching {name!r}; available: {self.names()}")
        return self._classes[name]

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._classes)


INPUT_BRANCHINGS: Registry[type] = Registry("input branching")
RELU_BRANCHINGS: Registry[type] = Registry("relu branching")
