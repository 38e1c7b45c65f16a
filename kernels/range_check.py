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
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["available", "range_check", "range_check_reference"]

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
        except (OSError, subprocess.SubprocessError):
            lib = None
    _LIB.append(lib)
    return lib


def available() -> bool:
    """Whether the C kernel is built and loaded (else `range_check` runs the reference)."""
    return _library() is not None


def _address(t: Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


def _check_args(x: Tensor, flags: Tensor | None, det_hi: Tensor | None, write: str,
                out: Tensor | None) -> None:  # fmt: skip
    if write not in _WRITE:
        raise ValueError(f"write must be one of {', '.join(_WRITE)}; got {write!r}")
    if write != "none" and (out is None or out.shape != x.shape or out.dtype != x.dtype):
        raise ValueError("out must be a tensor of x's shape and dtype when write is not 'none'")
    if det_hi is not None and (flags is None or flags.shape != (x.shape[0],)):
        raise ValueError("detection needs flags of shape [rows]")


def range_check_reference(x: Tensor, flags: Tensor | None, det_lo: Tensor | None,
                          det_hi: Tensor | None, clip_lo: Tensor | None, clip_hi: Tensor | None,
                          write: str, out: Tensor | None,
                          region: Tensor | None) -> Tensor:  # fmt: skip
    """`range_check` in plain torch (several passes; any device)."""
    _check_args(x, flags, det_hi, write, out)
    rows = x.shape[0]
    flat = x.reshape(rows, -1)

    def table(t: Tensor) -> Tensor:
        return t[region] if region is not None else t[:1]

    if det_hi is not None:
        bad = ~(flat <= table(det_hi))
        if det_lo is not None:
            bad |= ~(flat >= table(det_lo))
        flags.copy_(bad.any(1))
    if write == "none":
        return x
    if write == "relu":
        value = torch.where(flat < 0, torch.zeros((), dtype=x.dtype, device=x.device), flat)
    else:
        low, high = table(clip_lo), table(clip_hi)
        value = torch.where(flat >= low, flat, low)
        value = torch.where(value <= high, value, high)
    out.copy_(value.view_as(out))
    return out


_POOL: list[ThreadPoolExecutor] = []
_SPLIT_AT = 1 << 20  # values per call below which one thread does it all


def _run(fn, rows: int, n: int, item: int, args: list[int | None]) -> None:
    """`fn` over all rows; split by rows over `torch.get_num_threads()` threads when large.
    `args`: the addresses of x, out, det_lo, det_hi, clip_lo, clip_hi, region, flags."""
    threads = min(torch.get_num_threads(), rows)
    if threads <= 1 or rows * n < _SPLIT_AT:
        fn(ctypes.c_int64(rows), ctypes.c_int64(n), *map(ctypes.c_void_p, args))
        return
    if not _POOL or _POOL[0]._max_workers < threads:
        _POOL[:] = [ThreadPoolExecutor(threads)]
    cuts = [rows * i // threads for i in range(threads + 1)]
    x, out, tables, region, flags = args[0], args[1], args[2:6], args[6], args[7]
    jobs = []
    for a, b in itertools.pairwise(cuts):
        moved = [x + a * n * item, out and out + a * n * item, *tables,
                 region and region + 8 * a, flags and flags + a]  # fmt: skip
        jobs.append(_POOL[0].submit(fn, ctypes.c_int64(b - a), ctypes.c_int64(n),
                                    *map(ctypes.c_void_p, moved)))  # fmt: skip
    for job in jobs:
        job.result()


def _takes(x: Tensor, *others: Tensor | None) -> bool:
    """Whether the C kernel takes these tensors (CPU, float32/64, contiguous, one dtype)."""
    if x.device.type != "cpu" or x.dtype not in _TYPES or not x.is_contiguous():
        return False
    return all(t is None or (t.device.type == "cpu" and t.is_contiguous()
                             and t.dtype in (x.dtype, torch.int64, torch.uint8))
               for t in others)  # fmt: skip


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
    _check_args(x, flags, det_hi, write, out)
    lib = _library()
    tensors = (out, det_lo, det_hi, clip_lo, clip_hi, region, flags)
    if lib is None or not _takes(x, *tensors):
        return range_check_reference(x, flags, det_lo, det_hi, clip_lo, clip_hi, write, out,
                                     region)  # fmt: skip
    if write == "clamp" and (clip_lo is None or clip_hi is None):
        raise ValueError("write='clamp' needs clip_lo and clip_hi")
    detect = "none" if det_hi is None else ("upper" if det_lo is None else "both")
    if detect == "none" and write == "none":
        return x
    suffix = str(x.dtype).split(".")[-1]
    fn = getattr(lib, f"rc_{suffix}_{detect}_{write}")
    rows = x.shape[0]
    n = x.numel() // rows if rows else 0
    kept = (x, out if write != "none" else None, det_lo, det_hi, clip_lo, clip_hi, region,
            flags if detect != "none" else None)  # fmt: skip
    if rows:
        _run(fn, rows, n, x.element_size(), [_address(t) for t in kept])
    return out if write != "none" else x
