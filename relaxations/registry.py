"""The registry of relaxations: each relaxation module registers its classes, and declares with
the name how torch and ONNX spell the function, so the front ends read this registry and keep
no table of their own:

    @register("tanh", torch=(torch.tanh, F.tanh, "tanh", nn.Tanh), onnx=("Tanh",))
    class TanhRelaxation(MonotoneSRelaxation): ...

- `torch`: `Spelling`s (or bare targets, without options): torch functions (`torch.tanh`,
  `operator.pow`), `nn.Module` classes (exact type) and tensor methods (by name), each with
  how it reads its constants into the relaxation's options (`bounds.fx_activations`);
- `onnx`: `OnnxOp`s (or bare op names): each reads its node (`OnnxNode`: attributes, constant
  inputs, the activation's shape) into the torch call it becomes, which the torch spellings
  then map back to the relaxation (`verify.io.onnx_nonlinear`). A bare name becomes the
  relaxation's first torch function or module class applied to the input alone.

`get_relaxation(name, **options)` instantiates a relaxation; `available_relaxations()`,
`entries()`, `spellings()` and `onnx_ops()` list what is registered; `unregister` removes one (tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

from relaxations.base import MultiRelaxation, Relaxation

Options = Callable[..., dict[str, Any]]


def no_options(*args: Any, inplace: bool = False, **kwargs: Any) -> dict[str, Any]:
    """No constants (an `inplace` flag changes nothing here)."""
    if args or kwargs:
        raise ValueError(f"unexpected arguments {args} {kwargs}")
    return {}


def _module_options(module: nn.Module) -> dict[str, Any]:
    """A module spelling's default: its state gives no options."""
    return {}


@dataclass(frozen=True)
class Spelling:
    """One torch spelling: `target` is a torch function, an `nn.Module` class (matched by exact
    type) or a tensor method's name; `options(*args, **kwargs)` turns the call's arguments after
    the activation (for a module: the module itself) into the relaxation's options, raising
    ValueError for constants it cannot bound (None: no options). With `shaped`, `options` also
    receives the activation's per-sample shape as the keyword `shape`."""

    target: Any
    options: Options | None = None
    shaped: bool = False

    @property
    def kind(self) -> str:
        """The kind of target: "method" (a name), "module" (a module class) or "function"."""
        if isinstance(self.target, str):
            return "method"
        if isinstance(self.target, type) and issubclass(self.target, nn.Module):
            return "module"
        return "function"

    def read(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The relaxation's options for a call with these arguments."""
        if self.options is not None:
            return self.options(*args, **kwargs)
        return (_module_options if self.kind == "module" else no_options)(*args, **kwargs)


@dataclass(frozen=True)
class OnnxNode:
    """What an ONNX node's translation reads: its decoded attributes, its inputs after the first
    as constant tensors (None where absent) and the activation's shape (`batched`: its first
    axis is the batch)."""

    op_type: str
    attributes: dict[str, Any]
    constants: tuple[Tensor | None, ...]
    shape: tuple[int, ...]
    batched: bool


@dataclass(frozen=True)
class TorchCall:
    """`function(x, *arguments)`, or `function(*arguments)(x)` for an `nn.Module` class; tensor
    arguments become constants of the graph."""

    function: Callable[..., Any]
    arguments: tuple[Any, ...] = ()


class InvalidNodeError(ValueError):
    """The node is malformed (not merely outside what the relaxation bounds)."""


OnnxReader = Callable[[OnnxNode], TorchCall | None]


@dataclass(frozen=True)
class OnnxOp:
    """ONNX op `op_type`; `read(node)` gives the torch call it becomes (None: the input itself),
    raising ValueError where unsupported, `InvalidNodeError` where malformed. Without `read`:
    the relaxation's first torch function or module class, on the input alone."""

    op_type: str
    read: OnnxReader | None = None


@dataclass(frozen=True)
class Entry:
    """A registered relaxation: its class and its spellings."""

    name: str
    cls: type
    torch: tuple[Spelling, ...]
    onnx: tuple[OnnxOp, ...]

    def default_call(self) -> TorchCall:
        """The first torch function or module class, on the input alone."""
        for spelling in self.torch:
            if spelling.kind != "method":
                return TorchCall(spelling.target)
        raise ValueError(f"relaxation {self.name!r} declares no torch function or module")


_REGISTRY: dict[str, Entry] = {}
_SPELLINGS: dict[Any, tuple[str, Spelling]] = {}  # function or method name -> (name, spelling)
_MODULES: dict[type, tuple[str, Spelling]] = {}
_ONNX: dict[str, tuple[str, OnnxOp]] = {}


def _with_traits(cls: type) -> type:
    """`cls` itself when it derives from `Relaxation` or `MultiRelaxation`, else a subclass of
    it and of the base (by `n_inputs`), so that every trait has its default."""
    if issubclass(cls, (Relaxation, MultiRelaxation)):
        return cls
    base = MultiRelaxation if getattr(cls, "n_inputs", 1) > 1 else Relaxation
    names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    return type(cls.__name__, (cls, base), names)


def _entry(name: str, cls: type, torch: Iterable[Any], onnx: Iterable[Any]) -> Entry:
    spellings = tuple(s if isinstance(s, Spelling) else Spelling(s) for s in torch)
    ops = tuple(op if isinstance(op, OnnxOp) else OnnxOp(op) for op in onnx)
    entry = Entry(name, cls, spellings, ops)
    taken = [
        *(_SPELLINGS.get(s.target) for s in spellings if s.kind != "module"),
        *(_MODULES.get(s.target) for s in spellings if s.kind == "module"),
        *(_ONNX.get(op.op_type) for op in ops),
    ]
    clash = [owner for owner, _ in filter(None, taken) if owner != name]
    if clash:
        raise ValueError(f"relaxation {name!r}: a spelling is already {clash[0]!r}'s")
    if any(op.read is None for op in ops):
        entry.default_call()  # raises if there is none
    return entry


def register(
    name: str, *, torch: Iterable[Any] = (), onnx: Iterable[Any] = ()
) -> Callable[[type], type]:
    """Class decorator: register a relaxation class under `name`, with its torch spellings
    (`Spelling`s or bare targets) and ONNX ops (`OnnxOp`s or bare op names); see the module
    docstring. `get_relaxation(name, **options)` instantiates it (options are the function's
    constants: a leaky slope, clip limits, an exponent). Registering a name again replaces it;
    a spelling another relaxation has raises ValueError. A class without a `name` takes
    `name`; one not derived from `Relaxation` / `MultiRelaxation` gets their defaults (the
    registered class is then a subclass of it and of the base)."""

    def wrap(cls: type) -> type:
        cls = _with_traits(cls)
        if not cls.name:  # the default of `Traits`
            cls.name = name
        entry = _entry(name, cls, torch, onnx)
        unregister(name)
        _REGISTRY[name] = entry
        for spelling in entry.torch:
            index = _MODULES if spelling.kind == "module" else _SPELLINGS
            index[spelling.target] = (name, spelling)
        for op in entry.onnx:
            _ONNX[op.op_type] = (name, op)
        return cls

    return wrap


def unregister(name: str) -> None:
    """Remove the relaxation `name` and its spellings (nothing if it is not registered)."""
    entry = _REGISTRY.pop(name, None)
    if entry is None:
        return
    for spelling in entry.torch:
        (_MODULES if spelling.kind == "module" else _SPELLINGS).pop(spelling.target, None)
    for op in entry.onnx:
        _ONNX.pop(op.op_type, None)


def get_relaxation(name: str, **options: Any) -> Relaxation | MultiRelaxation:
    """The relaxation called `name` for the given constants (KeyError with the known names for
    an unknown one; ValueError for options it does not take or rejects)."""
    try:
        cls = _REGISTRY[name].cls
    except KeyError:
        raise KeyError(f"no relaxation {name!r}; known: {sorted(_REGISTRY)}") from None
    try:
        return cls(**options)
    except TypeError as exc:
        raise ValueError(f"relaxation {name!r} does not take options {sorted(options)}") from exc


def available_relaxations() -> tuple[str, ...]:
    """The registered names, sorted."""
    return tuple(sorted(_REGISTRY))


def entries() -> tuple[Entry, ...]:
    """Every registered relaxation's entry (class and spellings), sorted by name."""
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


def spellings() -> tuple[tuple[str, Spelling], ...]:
    """Every registered torch spelling with its relaxation's name, in registration order."""
    return tuple((e.name, s) for e in _REGISTRY.values() for s in e.torch)


def spelling_of(target: Any) -> tuple[str, Spelling] | None:
    """The relaxation's name and spelling for a torch function or a method name, or None."""
    try:
        return _SPELLINGS.get(target)
    except TypeError:  # an unhashable target
        return None


def module_spelling(module: nn.Module) -> tuple[str, Spelling] | None:
    """The relaxation's name and spelling for a module (exact type match), or None."""
    return _MODULES.get(type(module))


def onnx_ops() -> dict[str, tuple[Entry, OnnxOp]]:
    """Every registered ONNX op type: its relaxation's entry and its `OnnxOp`."""
    return {op_type: (_REGISTRY[name], op) for op_type, (name, op) in _ONNX.items()}
