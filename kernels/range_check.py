"""Range check fused into the pass that writes an activation (CPU, C): kernel, launcher,
pure-torch reference and dispatch.

One pass over `x [rows, n]` (a batch of samples, `n` values each) does what the eager checks
of an SDC monitor do in several:

- detection: per row, whether a value leaves `[lo_j, hi_j]` (`flags[r] = 1`; NaN leaves
  every range: the tests are `!(v <= hi)` and `!(v >= lo)`); `lo = None` checks the upper end
  only (a ReLU output whose lower end is at most 0 cannot fail it);
- the value written to `out` (which may be `x` itself, in place: each value is read before it
  is written): nothing, `relu(v)` (`v < 0 ? 0 : v`, which keeps `-0.0` and NaN as
  `torch.relu` does), or the clamp `c = v >= L ? v : L; c = c <= H ? c : H` (NaN becomes
  `L`; a value inside its range is written unchanged, to the bit). A ReLU followed by a clamp
  to `[lo, hi]` is one clamp to `[max(lo, 0), max(hi, 0)]`: the caller passes those bounds.

The bounds are tables `[R, n]` (one row per region of the monitor); `region [rows]` (int64)
picks each row's, else row 0 serves all. Every output is a comparison or a selection of
input values: no arithmetic, so no rounding, and the kernel's results are exactly the
reference's (`range_check_reference`), whatever the compiler vectorises.

The C source is compiled once per machine with the system C compiler (`CC`, else `cc`/`gcc`)
into `$LDVERIFY_CACHE` (default `~/.cache/ldverify`) and loaded with ctypes, which releases
the GIL during the call: with `torch.get_num_threads() > 1` large inputs are split by rows
over that many threads. Without a compiler, or for tensors the kernel does not take (not
CPU, not float32/float64, not contiguous), `range_check` runs the reference.
"""

from __future__ import annotations

import ctypes
import hashlib
import itertools
import os
import platform
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["AddCheck", "RangeCheck", "Side", "add_check", "add_check_reference", "available",
           "range_check", "range_check_reference"]  # fmt: skip

_DETECT = ("none", "upper", "both")
_WRITE = ("none", "relu", "clamp")
_DETECT_C = {
    "none": "",
    "upper": "bad |= !(v <= hi[j]);",
    "both": "bad |= !(v <= hi[j]); bad |= !(v >= lo[j]);",
}
_WRITE_C = {
    "none": "",
    "relu": "y[j] = v < 0 ? (T)0 : v;",
    "clamp": "T c = v >= cl[j] ? v : cl[j]; y[j] = c <= ch[j] ? c : ch[j];",
}
_TYPES = {torch.float32: "float", torch.float64: "double"}
_FUNCTION = """
void rc_{suffix}_{detect}_{write}(int64_t rows, int64_t n, const T* x, T* out, const T* dlo,
        const T* dhi, const T* clo, const T* chi, const int64_t* region, uint8_t* flags) {{
    for (int64_t r = 0; r < rows; ++r) {{
        const int64_t o = region ? region[r] * n : 0;
        const T* xr = x + r * n;
        T* y = out ? out + r * n : 0;
        const T* restrict lo = dlo ? dlo + o : 0;
        const T* restrict hi = dhi ? dhi + o : 0;
        const T* restrict cl = clo ? clo + o : 0;
        const T* restrict ch = chi ? chi + o : 0;
        int bad = 0;
        for (int64_t j = 0; j < n; ++j) {{
            const T v = xr[j];
            {detect_code}
            {write_code}
        }}
        if (dhi) flags[r] = (uint8_t)(bad != 0);
        (void)lo; (void)hi; (void)cl; (void)ch; (void)y;
    }}
}}
"""


# the residual add `s = a + b` of two activations (one IEEE addition, as torch's), each side
# with its own mode: n (not monitored), d (detect), c (clamp), b (both: detect the raw value,
# then clamp); `s` written as it is, as its ReLU, or clamped. Tables `t`: lo, hi, clamp lo,
# clamp hi of a, then of b, then of s; flags `f`: a's, b's, s's.
_SIDE_C = {
    "d": "bad{i} |= !(v{i} <= hi{i}[j]); bad{i} |= !(v{i} >= lo{i}[j]);",
    "c": "v{i} = v{i} >= cl{i}[j] ? v{i} : cl{i}[j]; v{i} = v{i} <= ch{i}[j] ? v{i} : ch{i}[j];",
}
_SIDE_C["b"] = _SIDE_C["d"] + " " + _SIDE_C["c"]
_SIDE_C["n"] = ""
_ADD = """
void ra_{suffix}_{modes}_{relu}(int64_t rows, int64_t n, const T* a, const T* b, T* out,
        const T* const* t, const int64_t* region, uint8_t* const* f) {{
    for (int64_t r = 0; r < rows; ++r) {{
        const int64_t o = region ? region[r] * n : 0;
        const T* ar = a + r * n;
        const T* br = b + r * n;
        T* y = out + r * n;
        const T* restrict lo0 = t[0] ? t[0] + o : 0; const T* restrict hi0 = t[1] ? t[1] + o : 0;
        const T* restrict cl0 = t[2] ? t[2] + o : 0; const T* restrict ch0 = t[3] ? t[3] + o : 0;
        const T* restrict lo1 = t[4] ? t[4] + o : 0; const T* restrict hi1 = t[5] ? t[5] + o : 0;
        const T* restrict cl1 = t[6] ? t[6] + o : 0; const T* restrict ch1 = t[7] ? t[7] + o : 0;
        const T* restrict lo2 = t[8] ? t[8] + o : 0; const T* restrict hi2 = t[9] ? t[9] + o : 0;
        const T* restrict cl2 = t[10] ? t[10] + o : 0; const T* restrict ch2 = t[11] ? t[11] + o : 0;
        int bad0 = 0, bad1 = 0, bad2 = 0;
        for (int64_t j = 0; j < n; ++j) {{
            T v0 = ar[j];
            T v1 = br[j];
            {side0}
            {side1}
            T v2 = v0 + v1;
            {side2}
            {relu_code}
            y[j] = v2;
        }}
        if (f[0]) f[0][r] = (uint8_t)(bad0 != 0);
        if (f[1]) f[1][r] = (uint8_t)(bad1 != 0);
        if (f[2]) f[2][r] = (uint8_t)(bad2 != 0);
        (void)lo0; (void)hi0; (void)cl0; (void)ch0; (void)lo1; (void)hi1; (void)cl1; (void)ch1;
        (void)lo2; (void)hi2; (void)cl2; (void)ch2;
    }}
}}
"""
# per action, the modes of a monitored input and of the sum
ADD_ACTIONS = {"detect": "d", "clip": "c", "both": "b"}


def _add_functions(suffix: str) -> list[str]:
    out = []
    for mode in ADD_ACTIONS.values():
        for ma in ("n", mode):
            for mb in ("n", mode):
                for relu in (0, 1):
                    out.append(_ADD.format(
                        suffix=suffix, modes=ma + mb + mode, relu=relu,
                        side0=_SIDE_C[ma].format(i=0), side1=_SIDE_C[mb].format(i=1),
                        side2=_SIDE_C[mode].format(i=2),
                        relu_code="v2 = v2 < 0 ? (T)0 : v2;" if relu and mode == "d" else ""))  # fmt: skip
    return out


def _source() -> str:
    parts = ["#include <stdint.h>"]
    for dtype, ctype in _TYPES.items():
        suffix = str(dtype).split(".")[-1]
        parts.append(f"#define T {ctype}")
        for detect in _DETECT:
            for write in _WRITE:
                if detect == "none" and write == "none":
                    continue
                parts.append(_FUNCTION.format(suffix=suffix, detect=detect, write=write,
                                              detect_code=_DETECT_C[detect],
                                              write_code=_WRITE_C[write]))  # fmt: skip
        parts.extend(_add_functions(suffix))
        parts.append("#undef T")
    # the in-place case (`out == x`) reads each value before writing it: `restrict` is only
    # on the read-only pointers
    return "\n".join(parts)


_FLAGS = ["-O3", "-std=c11", "-ffp-contract=off", "-fno-fast-math", "-fPIC", "-shared"]
_LIB: list = []  # [ctypes.CDLL or None], loaded once


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _machine() -> str:
    """What the `-march=native` build depends on: the architecture and the CPU's flags."""
    flags = ""
    try:
        with open("/proc/cpuinfo") as info:
            flags = next((line for line in info if line.startswith(("flags", "Features"))), "")
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()} {flags}"


def _build(source: str, target: Path) -> None:
    """Compiles `source` into `target`, for this CPU (`-march=native`) where the compiler
    takes it, else for the architecture's baseline."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, lib = Path(tmp) / "range_check.c", Path(tmp) / target.name
        src.write_text(source)
        for native in (["-march=native"], []):
            done = subprocess.run([_compiler(), *_FLAGS, *native, str(src), "-o", str(lib)],
                                  capture_output=True, timeout=120)  # fmt: skip
            if done.returncode == 0:
                break
        else:
            raise subprocess.CalledProcessError(done.returncode, done.args, stderr=done.stderr)
        os.replace(lib, target)  # atomic: a concurrent process sees all or nothing


def _declare(lib: ctypes.CDLL) -> None:
    """The argument types of every kernel (ctypes then takes Python ints as 64-bit values and
    addresses, None as NULL)."""
    index, pointer = ctypes.c_int64, ctypes.c_void_p
    for suffix in (str(d).split(".")[-1] for d in _TYPES):
        for detect, write in itertools.product(_DETECT, _WRITE):
            if (detect, write) != ("none", "none"):
                fn = getattr(lib, f"rc_{suffix}_{detect}_{write}")
                fn.argtypes, fn.restype = [index, index] + [pointer] * 8, None
        for mode in ADD_ACTIONS.values():
            for ma, mb, relu in itertools.product(("n", mode), ("n", mode), (0, 1)):
                fn = getattr(lib, f"ra_{suffix}_{ma}{mb}{mode}_{relu}")
                fn.argtypes, fn.restype = [index, index] + [pointer] * 6, None


def _library() -> ctypes.CDLL | None:
    """The compiled kernels (built on first use), or None where no C compiler works."""
    if _LIB:
        return _LIB[0]
    lib = None
    if _compiler() is not None and os.environ.get("LDVERIFY_RANGE_CHECK", "c") != "reference":
        source = _source()
        key = hashlib.sha256((source + " ".join(_FLAGS) + _machine()).encode()).hexdigest()[:16]
        cache = Path(os.environ.get("LDVERIFY_CACHE", Path.home() / ".cache" / "ldverify"))
        target = cache / f"range_check_{key}.so"
        try:
            if not target.exists():
                _build(source, target)
            lib = ctypes.CDLL(str(target))
            _declare(lib)
        except (OSError, subprocess.SubprocessError):
            lib = None
    _LIB.append(lib)
    return lib


def available() -> bool:
    """Whether the C kernel is built and loaded (else `range_check` runs the reference)."""
    return _library() is not None


def _check_args(x: Tensor, flags: Tensor | None, det_hi: Tensor | None, write: str,
                out: Tensor | None) -> None:  # fmt: skip
    if write not in _WRITE:
        raise ValueError(f"write must be one of {', '.join(_WRITE)}; got {write!r}")
    if write != "none" and (out is None or out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError("out must be a tensor of x's shape and dtype when write is not 'none'")
    if det_hi is not None and (flags is None or flags.shape != (x.shape[0],)):
        raise ValueError("detection needs flags of shape [rows]")


def _outside(v: Tensor, lo: Tensor | None, hi: Tensor) -> Tensor:
    """Per row, whether a value of `v [rows, n]` leaves `[lo, hi]` (NaN does; `lo` None: the
    upper end only): the kernels' `!(v <= hi) | !(v >= lo)`."""
    bad = ~(v <= hi)
    if lo is not None:
        bad |= ~(v >= lo)
    return bad.any(1)


def _clamp(v: Tensor, lo: Tensor, hi: Tensor) -> Tensor:
    """The kernels' clamp `c = v >= lo ? v : lo; c <= hi ? c : hi` (NaN becomes `lo`)."""
    c = torch.where(v >= lo, v, lo)
    return torch.where(c <= hi, c, hi)


def _relu(v: Tensor) -> Tensor:
    """The kernels' `v < 0 ? 0 : v` (keeps `-0.0` and NaN, as `torch.relu`)."""
    return torch.where(v < 0, torch.zeros((), dtype=v.dtype, device=v.device), v)


def range_check_reference(x: Tensor, flags: Tensor | None, det_lo: Tensor | None,
                          det_hi: Tensor | None, clip_lo: Tensor | None, clip_hi: Tensor | None,
                          write: str, out: Tensor | None,
                          region: Tensor | None) -> Tensor:  # fmt: skip
    """`range_check` in plain torch (several passes; any device)."""
    _check_args(x, flags, det_hi, write, out)
    rows = x.shape[0]
    flat = x.reshape(rows, -1)

    def table(t: Tensor | None) -> Tensor | None:
        return t if t is None else (t[region] if region is not None else t[:1])

    if det_hi is not None:
        flags.copy_(_outside(flat, table(det_lo), table(det_hi)))
    if write == "none":
        return x
    value = _relu(flat) if write == "relu" else _clamp(flat, table(clip_lo), table(clip_hi))
    out.copy_(value.view_as(out))
    return out


_POOL: list[ThreadPoolExecutor] = []
_SPLIT_AT = 1 << 20  # values per call below which one thread does it all


def _split(call, rows: int, n: int) -> None:
    """`call(start, stop)` over all rows; split by rows over `torch.get_num_threads()`
    threads when the input is large (ctypes releases the GIL during each call)."""
    threads = min(torch.get_num_threads(), rows)
    if threads <= 1 or rows * n < _SPLIT_AT:
        call(0, rows)
        return
    if not _POOL or _POOL[0]._max_workers < threads:
        _POOL[:] = [ThreadPoolExecutor(threads)]
    cuts = [rows * i // threads for i in range(threads + 1)]
    for job in [_POOL[0].submit(call, a, b) for a, b in itertools.pairwise(cuts)]:
        job.result()


def _at(t: Tensor | None, start: int, n: int = 1) -> int | None:
    """The address of row `start` of `t` (`n` values a row), or NULL."""
    return None if t is None else t.data_ptr() + start * n * t.element_size()


def _cpu_contiguous(*tensors: Tensor | None) -> bool:
    return all(t is None or (t.is_cpu and t.is_contiguous()) for t in tensors)


def _takes(x: Tensor, *others: Tensor | None) -> bool:
    """Whether the C kernel takes these tensors (CPU, float32/64, contiguous, one dtype)."""
    return x.dtype in _TYPES and _cpu_contiguous(x, *others) and all(
        t is None or t.dtype in (x.dtype, torch.int64, torch.uint8) for t in others)  # fmt: skip


def _fast(x: Tensor, dtype: torch.dtype, *others: Tensor | None) -> bool:
    """Whether a prepared kernel of `dtype` takes `x` and the per-call tensors `others`
    (CPU, contiguous; their dtypes are the caller's to get right)."""
    return x.dtype == dtype and _cpu_contiguous(x, *others)


class RangeCheck:
    """`range_check` with its tables fixed and validated once: `(x, flags, out, region)` per
    call costs a few checks and the kernel (a batch-1 inference calls one per node)."""

    def __init__(self, det_lo: Tensor | None, det_hi: Tensor | None, clip_lo: Tensor | None,
                 clip_hi: Tensor | None, write: str) -> None:  # fmt: skip
        if write not in _WRITE:
            raise ValueError(f"write must be one of {', '.join(_WRITE)}; got {write!r}")
        if write == "clamp" and (clip_lo is None or clip_hi is None):
            raise ValueError("write='clamp' needs clip_lo and clip_hi")
        self.tables, self.write = (det_lo, det_hi, clip_lo, clip_hi), write
        self.detect = "none" if det_hi is None else ("upper" if det_lo is None else "both")
        # the tables give the kernel's dtype (without any: the reference, or nothing to do)
        like = det_hi if det_hi is not None else (clip_lo if write == "clamp" else None)
        lib, self.fn = _library(), None
        if lib is not None and like is not None and _takes(like, *self.tables):
            suffix = str(like.dtype).split(".")[-1]
            self.fn = getattr(lib, f"rc_{suffix}_{self.detect}_{write}")
            self.dtype, self.addresses = like.dtype, [_at(t, 0) for t in self.tables]

    def __call__(self, x: Tensor, flags: Tensor | None = None, out: Tensor | None = None,
                 region: Tensor | None = None) -> Tensor:  # fmt: skip
        write, detect = self.write, self.detect != "none"
        if self.fn is None or not _fast(x, self.dtype, out, region, flags):
            return range_check_reference(x, flags, *self.tables, write, out, region)
        _check_args(x, flags, self.tables[1], write, out)
        rows = x.shape[0]
        n = x.numel() // rows if rows else 0
        out = out if write != "none" else None
        flags = flags if detect else None
        fn, tables = self.fn, self.addresses

        def call(start: int, stop: int) -> None:
            fn(stop - start, n, _at(x, start, n), _at(out, start, n), *tables, _at(region, start),
               _at(flags, start))  # fmt: skip

        if rows and (detect or write != "none"):
            _split(call, rows, n)
        return out if write != "none" else x


def range_check(x: Tensor, flags: Tensor | None = None, *, det_lo: Tensor | None = None,
                det_hi: Tensor | None = None, clip_lo: Tensor | None = None,
                clip_hi: Tensor | None = None, write: str = "none", out: Tensor | None = None,
                region: Tensor | None = None) -> Tensor:  # fmt: skip
    """Checks and/or writes `x [rows, *shape]` in one pass (module docstring).

    Args:
        x: the activation, `[rows, *shape]` (`n` = its values per row).
        flags: `[rows]` uint8, set to 1 where a row leaves its detection range (detection
            only; written whole).
        det_lo, det_hi: detection bounds `[R, n]` (`det_hi` None: no detection; `det_lo`
            None: the upper end only).
        clip_lo, clip_hi: clamp bounds `[R, n]` for `write="clamp"`.
        write: "none" (read only), "relu" or "clamp".
        out: where the written values go (`x` itself for in place).
        region: `[rows]` int64 region of each row (rows of the tables), or None (row 0).

    Returns:
        `out` (or `x` for `write="none"`).
    """
    return RangeCheck(det_lo, det_hi, clip_lo, clip_hi, write)(x, flags, out, region)


@dataclass(frozen=True)
class Side:
    """One operand (or the sum) of `add_check`: its detection tables `det = (lo, hi)` (`[R,
    n]` each; a lower table of `-inf` where only the upper end matters), its clamp tables
    `clamp = (lo, hi)`, and `flags` (`[rows]` uint8, written where `det` is given). An
    operand with neither is taken as it is."""

    det: tuple[Tensor, Tensor] | None = None
    clamp: tuple[Tensor, Tensor] | None = None
    flags: Tensor | None = None

    @property
    def mode(self) -> str:
        return {(False, False): "n", (True, False): "d", (False, True): "c",
                (True, True): "b"}[self.det is not None, self.clamp is not None]  # fmt: skip


def _side_reference(v: Tensor, side: Side, pick) -> Tensor:
    if side.det is not None:
        side.flags.copy_(_outside(v, *(pick(t) for t in side.det)))
    if side.clamp is not None:
        v = _clamp(v, *(pick(t) for t in side.clamp))
    return v


def add_check_reference(a: Tensor, b: Tensor, out: Tensor, sides: tuple[Side, Side, Side],
                        relu: bool, region: Tensor | None) -> Tensor:  # fmt: skip
    """`add_check` in plain torch (any device)."""
    rows = a.shape[0]

    def pick(t: Tensor) -> Tensor:
        return t[region] if region is not None else t[:1]

    va = _side_reference(a.reshape(rows, -1), sides[0], pick)
    vb = _side_reference(b.reshape(rows, -1), sides[1], pick)
    v = _side_reference(va + vb, sides[2], pick)
    if relu and sides[2].clamp is None:
        v = _relu(v)
    out.copy_(v.view_as(out))
    return out


class AddCheck:
    """`add_check` with its tables fixed and validated once (`sides`: a's, b's and the sum's
    `Side`, their flags ignored): `(a, b, out, flags, region)` per call, `flags` the three
    sides' (None where not detected)."""

    def __init__(self, sides: tuple[Side, Side, Side], relu: bool) -> None:
        mode = sides[2].mode
        if mode == "n" or any(side.mode not in ("n", mode) for side in sides[:2]):
            raise ValueError(f"add_check: operand modes {sides[0].mode}{sides[1].mode} do not "
                             f"fit the sum's {mode!r}")  # fmt: skip
        self.sides, self.relu = tuple(Side(s.det, s.clamp) for s in sides), relu
        self.detected = [s.det is not None for s in sides]
        tables = [t for side in sides for pair in (side.det, side.clamp)
                  for t in (pair if pair is not None else (None, None))]  # fmt: skip
        like = next(t for t in tables if t is not None)
        lib, self.fn = _library(), None
        if lib is not None and _takes(like, *tables):
            suffix = str(like.dtype).split(".")[-1]
            modes = sides[0].mode + sides[1].mode + mode
            self.fn = getattr(lib, f"ra_{suffix}_{modes}_{int(relu)}")
            self.dtype = like.dtype
            self.table_array = (ctypes.c_void_p * 12)(*(_at(t, 0) for t in tables))

    def __call__(self, a: Tensor, b: Tensor, out: Tensor,
                 flags: tuple[Tensor | None, Tensor | None, Tensor | None],
                 region: Tensor | None = None) -> Tensor:  # fmt: skip
        if not (a.shape == b.shape == out.shape and a.dtype == b.dtype == out.dtype):
            raise ValueError("add_check takes a, b and out of one shape and dtype")
        if any(d and (f is None or f.shape != (a.shape[0],)) for d, f in zip(self.detected, flags)):
            raise ValueError("add_check: a detected side needs flags of shape [rows]")
        if self.fn is None or not _fast(a, self.dtype, b, out, region, *flags):
            sides = tuple(Side(s.det, s.clamp, f) for s, f in zip(self.sides, flags))
            return add_check_reference(a, b, out, sides, self.relu, region)
        fn, table_array = self.fn, self.table_array
        rows = a.shape[0]
        n = a.numel() // rows if rows else 0

        def call(start: int, stop: int) -> None:
            at = (ctypes.c_void_p * 3)(*(_at(f, start) for f in flags))
            fn(stop - start, n, _at(a, start, n), _at(b, start, n), _at(out, start, n),
               table_array, _at(region, start), at)  # fmt: skip

        if rows:
            _split(call, rows, n)
        return out


def add_check(a: Tensor, b: Tensor, out: Tensor, sides: tuple[Side, Side, Side], *,
              relu: bool = False, region: Tensor | None = None) -> Tensor:  # fmt: skip
    """`out = a + b` (then its ReLU where `relu`), with each operand and the sum checked and/or
    clamped (`sides`: a's, b's, the sum's) in one pass; `out` may be `a` or `b` (in place).

    The sum's side must be monitored with the mode of the operands that are (detect, clamp or
    both); with a clamp and `relu` its clamp tables are the ReLU's (`max(lo, 0)`, `max(hi,
    0)`), which the kernel applies in place of the ReLU. Returns `out`."""
    return AddCheck(sides, relu)(a, b, out, tuple(s.flags for s in sides), region)
