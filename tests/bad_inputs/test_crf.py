"""Bad input to the dense CRF (issue 11): the API, the file loaders, the CLI and the example.

Every case asserts the error type, the what-and-where of its message (parameter, file, index)
and, for entry points that read or write files, that nothing under tmp_path was written.
Fixtures are tiny images generated here; the real annotation is only read (``shared_data``).
"""

from __future__ import annotations

import importlib.util
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import crf
import crf.io
import crf.refine_dir
from crf.__main__ import _parser, main, refine
from crf.api import DenseCRF
from crf.errors import (
    ConfigError,
    InputFileError,
    InvalidValueError,
    OutputPathError,
    ShapeMismatchError,
    TooManyLabelsError,
)
from tests.bad_inputs.conftest import no_side_effects, raises_where

H, W = 12, 14
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "crf_refine.py"
# Eight saturated colours in 8 x 8 patches: as a JPEG (quality 75) it decodes to ~900 colours.
SATURATED = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (0, 255, 255), (255, 0, 255)]
PATCH_COLOURS = np.array([*SATURATED, (128, 0, 0), (0, 128, 0)], np.uint8)
NAN, INF = float("nan"), float("inf")
PROBS = np.full((H, W, 2), 0.5)


def _cases(*rows: tuple) -> list:
    """``pytest.param``s from rows ``(id, *values)``."""
    return [pytest.param(*row[1:], id=row[0]) for row in rows]


def _image(h: int = H, w: int = W) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def _unary(h: int = H, w: int = W, m: int = 3) -> np.ndarray:
    rng = np.random.default_rng(1)
    return crf.unary_from_probs(rng.dirichlet(np.ones(m), size=(h, w)))


def _with(a: np.ndarray, index: tuple, value) -> np.ndarray:
    out = a.astype(np.float64 if np.isnan(value) or abs(value) > 1e38 else a.dtype)
    out[index] = value
    return out


def _png_header_only(path: Path, width: int, height: int) -> Path:
    """A PNG that declares width x height RGB pixels but holds almost no data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 16)) + chunk(b"IEND", b"")
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + body)
    return path


def _jpeg_annotation(path: Path, n: int = 64) -> Path:
    idx = (np.arange(n)[:, None] // 8 * 3 + np.arange(n)[None, :] // 8) % 8
    Image.fromarray(PATCH_COLOURS[idx]).save(path, quality=75)
    return path


# --- DenseCRF(...) ------------------------------------------------------------------------

CONSTRUCTOR_CASES = _cases(
    ("sigma-zero", {"sigma_smooth": 0.0}, ConfigError, ("sigma_smooth", "got 0.0")),
    ("sigma-negative", {"sigma_xy": -5.0}, ConfigError, ("sigma_xy", "got -5.0")),
    ("sigma-nan", {"sigma_rgb": NAN}, ConfigError, ("sigma_rgb", "nan")),
    ("sigma-inf", {"sigma_xy": INF}, ConfigError, ("sigma_xy", "inf")),
    ("sigma-tiny", {"sigma_smooth": 1e-30}, ConfigError, ("sigma_smooth", "1e-30", "MIN_SIGMA")),
    (
        "sigma-lattice-overflow",
        {"sigma_rgb": 1e-3},
        ConfigError,
        ("sigma_rgb=0.001", "sigma_xy=80.0", "12 x 14", "lattice"),
    ),
    ("weight-nan", {"w_smooth": NAN}, ConfigError, ("w_smooth", "nan")),
    ("weight-negative", {"w_appearance": -1.0}, ConfigError, ("w_appearance", "-1.0")),
    ("weight-str", {"w_smooth": "3"}, ConfigError, ("w_smooth", "'3'")),
    ("weight-huge", {"w_smooth": 1e300}, ConfigError, ("w_smooth", "overflow")),
    ("dtype-int", {"dtype": torch.int64}, ConfigError, ("dtype", "int64")),
    ("dtype-half", {"dtype": torch.float16}, ConfigError, ("dtype", "float16")),
    ("device-bogus", {"device": "gpu0"}, ConfigError, ("device", "'gpu0'")),
    ("device-absent", {"device": "cuda:99"}, ConfigError, ("device", "'cuda:99'")),
    ("normalize", {"normalize": "mean"}, ConfigError, ("normalize", "'mean'")),
    ("filtering", {"filtering": "fft"}, ConfigError, ("filtering", "'fft'")),
)


@pytest.mark.parametrize(("kwargs", "error", "where"), CONSTRUCTOR_CASES)
def test_constructor_parameters(kwargs, error, where):
    with raises_where(error, *where):
        DenseCRF(_image(), _unary(), **kwargs)


ARRAY_CASES = _cases(
    ("image-float", lambda: _image() / 255, InvalidValueError, ("image", "float64", "uint8")),
    ("image-object", lambda: _image().astype(object), InvalidValueError, ("image", "object")),
    ("image-2-channels", lambda: _image()[..., :2], ShapeMismatchError, ("image", "(12, 14, 2)")),
    ("image-empty", lambda: (_image()[:0], _unary()[:0]), ShapeMismatchError, ("image", "empty")),
    ("image-is-a-path", lambda: "photo.png", InvalidValueError, ("image", "'photo.png'")),
    ("image-range", lambda: _image().astype(int) * 3, InvalidValueError, ("image", "[0, 255]")),
    (
        "unary-size-mismatch",
        lambda: (_image(), _unary(H, W - 1)),
        ShapeMismatchError,
        ("unary", "(1, 12, 13)", "(1, 12, 14)"),
    ),
    (
        "unary-zero-labels",
        lambda: (_image(), _unary()[..., :0]),
        ShapeMismatchError,
        ("unary", "zero labels"),
    ),
    (
        "unary-nan-index",
        lambda: (_image(), _with(_unary(), (3, 4, 1), NAN)),
        InvalidValueError,
        ("unary", "NaN", "(3, 4, 1)"),
    ),
    (
        "unary-beyond-float32",
        lambda: (_image(), _with(_unary(), (5, 6, 2), 1e300)),
        InvalidValueError,
        ("unary", "float32", "(5, 6, 2)"),
    ),
    ("unary-str", lambda: (_image(), _unary().astype(str)), InvalidValueError, ("unary", "<U")),
    (
        "exact-too-large",
        lambda: (_image(64, 65), np.zeros((64, 65, 2), np.float32), "exact"),
        ConfigError,
        ("exact", "4160 x 4160", "MAX_EXACT_ENTRIES"),
    ),
)


@pytest.mark.parametrize(("make", "error", "where"), ARRAY_CASES)
def test_constructor_arrays(make, error, where):
    """``make`` gives the image, or (image, unary[, filtering])."""
    made = make()
    image, unary, *filtering = made if isinstance(made, tuple) else (made, _unary())
    with raises_where(error, *where):
        DenseCRF(image, unary, filtering=filtering[0] if filtering else "lattice")


# --- DenseCRF.map(...) and .energy(...) ---------------------------------------------------

MAP_CASES = _cases(
    ("iterations-negative", {"iterations": -1}, ("iterations", "-1")),
    ("iterations-zero", {"iterations": 0}, ("iterations", "got 0")),
    ("iterations-fraction", {"iterations": 2.5}, ("iterations", "2.5")),
    ("iterations-nan", {"iterations": NAN}, ("iterations", "nan")),
    ("iterations-inf", {"iterations": INF}, ("iterations", "inf")),
    ("iterations-str", {"iterations": "5"}, ("iterations", "'5'")),
    ("budget-negative", {"budget": -1.0}, ("budget", "-1.0")),
    ("budget-zero", {"budget": 0}, ("budget", "got 0")),
    ("budget-nan", {"budget": NAN}, ("budget", "nan")),
    ("budget-inf", {"budget": INF}, ("budget", "inf")),
    ("budget-str", {"budget": "1s"}, ("budget", "'1s'")),
    ("option-negative", {"lam": -1.0}, ("LPConfig.lam", "-1.0")),
    ("option-nan", {"tol": NAN}, ("LPConfig.tol", "nan")),
    ("option-unknown", {"typo": 3}, ("LPConfig", "typo")),
    ("init-unknown", {"init": "bogus"}, ("init", "'bogus'")),
    ("compile-bogus", {"compile": "sometimes"}, ("compile", "'sometimes'")),
)


@pytest.mark.parametrize(("kwargs", "where"), MAP_CASES)
def test_map_budgets_and_options_checked_before_any_work(kwargs, where, monkeypatch):
    """The lp pipeline would first run mean-field and dc-neg: every check comes before that."""
    model = DenseCRF(_image(), _unary())

    def no_init(*args, **kw):
        raise AssertionError("the init ran before the arguments were checked")

    if "init" not in kwargs:
        monkeypatch.setattr(DenseCRF, "_init", no_init)
    with raises_where(ConfigError, *where):
        model.map("lp", **kwargs)


MARGINAL_CASES = _cases(
    (
        "negative",
        lambda q: _with(q, (2, 3, 1), -0.25),
        InvalidValueError,
        ("negative", "(2, 3, 1)"),
    ),
    ("nan", lambda q: _with(q, (4, 5, 0), NAN), InvalidValueError, ("NaN", "(4, 5, 0)")),
    ("zero-row", lambda q: np.where(q > 0, 0.0, q), InvalidValueError, ("sum to 0", "(0, 0)")),
    ("label-count", lambda q: q[..., :2], ShapeMismatchError, ("2 labels", "unary 3")),
)


@pytest.mark.parametrize(("make", "error", "where"), MARGINAL_CASES)
def test_map_initial_marginals(make, error, where):
    model = DenseCRF(_image(), _unary())
    with raises_where(error, "init", *where):
        model.map("meanfield", init=make(np.full((H, W, 3), 1 / 3)))


def test_map_unknown_method_type_and_energy_labels():
    model = DenseCRF(_image(), _unary())
    with raises_where(ConfigError, "unknown method", "['lp']"):
        model.map(["lp"])
    with raises_where(InvalidValueError, "labels", "[0, 3)", "7"):
        model.energy(np.full((H, W), 7))


# --- unary helpers --------------------------------------------------------------------------


def test_annotation_with_too_many_colours_is_refused_before_the_unaries():
    c = np.arange(1, 301)  # 300 distinct colours, none black
    ann = np.stack([c >> 16, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(15, 20, 3)
    with raises_where(TooManyLabelsError, "annotation", "300 distinct", "cap of 256", "JPEG"):
        crf.labels_from_annotation(ann)
    with raises_where(TooManyLabelsError, "n_labels = 5000", "MAX_LABELS = 256"):
        crf.unary_from_labels(np.zeros((4, 4), np.int64), 5000)
    with raises_where(InvalidValueError, "unary_from_probs", "NaN", "(1, 2, 0)"):
        crf.unary_from_probs(_with(np.full((3, 3, 2), 0.5), (1, 2, 0), NAN))


# --- files: read_image / load_unary ----------------------------------------------------------


def _save(path: Path, array: np.ndarray) -> Path:
    Image.fromarray(array).save(path)
    return path


def _npy(path: Path, array: np.ndarray, **kw) -> Path:
    np.save(path, array, **kw)
    return path


def _bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _npz_named_npy(path: Path) -> Path:
    np.savez(path.with_suffix(".npz"), a=np.ones(3))
    return path.with_suffix(".npz").rename(path)


def _bomb(d: Path, name: str = "bomb.png") -> Path:
    return _png_header_only(d / name, 100_000, 100_000)


IMAGE_FILE_CASES = _cases(
    ("missing", lambda d: d / "nope.png", ("nope.png", "does not exist")),
    ("directory", lambda d: _folder(d / "sub.png"), ("sub.png", "directory")),
    ("bomb-100k", _bomb, ("bomb.png", "decompression bomb")),
    (
        "bomb-over-our-cap",
        lambda d: _png_header_only(d / "big.png", 5000, 5000),
        ("big.png", "5000 x 5000", "MAX_PIXELS"),
    ),
    ("truncated", lambda d: _bytes(d / "cut.png", (d / "ok.png").read_bytes()[:60]), ("cut.png",)),
    ("not-an-image", lambda d: _bytes(d / "text.png", b"this is not an image"), ("text.png",)),
    (
        "16-bit",
        lambda d: _save(d / "deep.png", (np.arange(H * W).reshape(H, W) * 300).astype(np.uint16)),
        ("deep.png", "I;16", "clipped"),
    ),
)


@pytest.mark.parametrize(("make", "where"), IMAGE_FILE_CASES)
def test_read_image_files(make, where, tmp_path):
    _save(tmp_path / "ok.png", _image())
    path = make(tmp_path)
    with no_side_effects(tmp_path), raises_where(InputFileError, *where):
        crf.io.read_image(path)


UNARY_FILE_CASES = _cases(
    (
        "npy-garbage",
        lambda d: _bytes(d / "junk.npy", b"\x00junk, not numpy"),
        InputFileError,
        ("junk.npy", "not a valid .npy"),
    ),
    (
        "npy-truncated",
        lambda d: _bytes(d / "cut.npy", _npy(d / "full.npy", PROBS).read_bytes()[:200]),
        InputFileError,
        ("cut.npy", "truncated", "2688 bytes"),
    ),
    ("npz-named-npy", lambda d: _npz_named_npy(d / "z.npy"), InputFileError, ("z.npy", "magic")),
    (
        "npy-object",
        lambda d: _npy(d / "obj.npy", np.full((H, W, 2), None, object), allow_pickle=True),
        InvalidValueError,
        ("obj.npy", "dtype object"),
    ),
    (
        "npy-str",
        lambda d: _npy(d / "str.npy", np.full((H, W, 2), "0.5")),
        InvalidValueError,
        ("str.npy", "<U3"),
    ),
    (
        "npy-2d",
        lambda d: _npy(d / "flat.npy", PROBS[..., 0]),
        ShapeMismatchError,
        ("flat.npy", "(H, W, M)", "(12, 14)"),
    ),
    (
        "npy-shape-vs-image",
        lambda d: _npy(d / "narrow.npy", PROBS[:, :-1]),
        ShapeMismatchError,
        ("narrow.npy", "(12, 13)", "(12, 14)"),
    ),
    (
        "npy-zero-labels",
        lambda d: _npy(d / "none.npy", PROBS[..., :0]),
        ShapeMismatchError,
        ("none.npy", "zero labels"),
    ),
    (
        "npy-too-many-labels",
        lambda d: _npy(d / "wide.npy", np.full((H, W, 300), 1 / 300)),
        TooManyLabelsError,
        ("wide.npy", "300 labels", "256"),
    ),
    (
        "npy-nan-index",
        lambda d: _npy(d / "nan.npy", _with(PROBS, (7, 9, 1), NAN)),
        InvalidValueError,
        ("nan.npy", "NaN", "(7, 9, 1)"),
    ),
    (
        "npy-inf-index",
        lambda d: _npy(d / "inf.npy", _with(PROBS, (0, 3, 0), INF)),
        InvalidValueError,
        ("inf.npy", "inf", "(0, 3, 0)"),
    ),
    (
        "npy-negative-index",
        lambda d: _npy(d / "neg.npy", _with(PROBS, (2, 2, 0), -0.5)),
        InvalidValueError,
        ("neg.npy", "negative", "(2, 2, 0)"),
    ),
    (
        "npy-not-probabilities",
        lambda d: _npy(d / "logits.npy", np.full((H, W, 2), 3.0)),
        InvalidValueError,
        ("logits.npy", "sum to 6.0000", "(0, 0)"),
    ),
    (
        "annotation-size",
        lambda d: _save(d / "small.png", np.zeros((H - 1, W, 3), np.uint8)),
        ShapeMismatchError,
        ("small.png", "(11, 14)", "(12, 14)"),
    ),
    (
        "annotation-one-colour",
        lambda d: _save(d / "one.png", np.full((H, W, 3), 9, np.uint8)),
        InvalidValueError,
        ("one.png", "two non-black colours", "found 1"),
    ),
    (
        "annotation-bomb",
        lambda d: _bomb(d, "annbomb.png"),
        InputFileError,
        ("annotation", "annbomb.png", "decompression bomb"),
    ),
    ("unary-is-a-folder", lambda d: d, InputFileError, ("unary file", "directory")),
)


@pytest.mark.parametrize(("make", "error", "where"), UNARY_FILE_CASES)
def test_load_unary_files(make, error, where, tmp_path):
    path = make(tmp_path)
    with no_side_effects(tmp_path), raises_where(error, *where):
        crf.io.load_unary(path, (H, W))


def _too_many_colours(message: str) -> int:
    count = int(re.search(r"(\d+) distinct non-black colours", message).group(1))
    assert count > crf.MAX_LABELS
    return count


def test_jpeg_annotation_refused_before_the_unaries(tmp_path, monkeypatch):
    """A JPEG of eight flat colours decodes to hundreds: refused, and (H, W, M) is never built."""
    path = _jpeg_annotation(tmp_path / "scribble.jpg")

    def no_unaries(*args, **kw):
        raise AssertionError("unaries were built for a refused annotation")

    monkeypatch.setattr(crf.io, "unary_from_labels", no_unaries)
    where = ("scribble.jpg", "JPEG", "cap of 256")
    with no_side_effects(tmp_path), raises_where(TooManyLabelsError, *where) as info:
        crf.io.load_unary(path, (64, 64))
    _too_many_colours(str(info.value))


def test_jpeg_annotation_under_the_cap_warns(tmp_path):
    """Fewer colours than the cap: accepted, with a warning that JPEG colours become labels."""
    ann = np.zeros((96, 96, 3), np.uint8)
    ann[:48, :48], ann[48:, 48:] = (255, 0, 0), (0, 0, 255)
    Image.fromarray(ann).save(tmp_path / "two.jpg", quality=75)
    with pytest.warns(UserWarning, match=r"two\.jpg is a JPEG"):
        unary, colours = crf.io.load_unary(tmp_path / "two.jpg", (96, 96))
    assert 2 < len(colours) <= crf.MAX_LABELS and unary.shape == (96, 96, len(colours))


def test_real_annotation_saved_as_jpeg(shared_data, tmp_path):
    """The issue's case: anno1.png re-saved as JPEG (5,417 colours with libjpeg-turbo)."""
    ann = crf.io.read_image(shared_data / "densecrf" / "anno1.png")
    path = tmp_path / "anno1.jpg"
    Image.fromarray(ann).save(path)
    with no_side_effects(tmp_path), raises_where(TooManyLabelsError, "anno1.jpg", "JPEG") as info:
        crf.io.load_unary(path, ann.shape[:2])
    _too_many_colours(str(info.value))


# --- the command line -----------------------------------------------------------------------


@pytest.fixture
def cli_files(tmp_path) -> Path:
    """tmp_path with a valid image and annotation (12 x 14), a 64 x 64 image with a JPEG
    annotation, a valid probability file, a decompression bomb and a folder."""
    ann = np.zeros((H, W, 3), np.uint8)
    ann[:5, :5] = (200, 0, 0)
    ann[7:, 9:] = (0, 0, 200)
    _save(tmp_path / "im.png", _image())
    _save(tmp_path / "ann.png", ann)
    _npy(tmp_path / "p.npy", PROBS)
    _jpeg_annotation(tmp_path / "scribble.jpg")
    _save(tmp_path / "im64.png", _image(64, 64))
    _bomb(tmp_path)
    _folder(tmp_path / "folder")
    return tmp_path


BASE = "{d}/im.png {d}/ann.png --out {d}/out.png"


def _argv(template: str, folder: Path) -> list[str]:
    return ["refine", *template.format(d=folder).split()]


CLI_CASES = _cases(
    (
        "out-folder-missing",
        BASE + " --out {d}/no/o.png",
        OutputPathError,
        ("--out", "no", "not exist"),
    ),
    ("out-is-a-folder", BASE + " --out {d}/folder", OutputPathError, ("--out", "is a directory")),
    ("out-lossy", BASE + " --out {d}/out.jpg", OutputPathError, ("--out", "out.jpg", "lossy")),
    ("out-no-suffix", BASE + " --out {d}/out", OutputPathError, ("--out", "unknown image suffix")),
    ("out-is-input", BASE + " --out {d}/im.png", OutputPathError, ("--out", "im.png", "input")),
    (
        "overlay-folder-missing",
        BASE + " --overlay {d}/no/ov.png",
        OutputPathError,
        ("--overlay", "no", "does not exist"),
    ),
    (
        "overlay-is-out",
        BASE + " --overlay {d}/out.png",
        OutputPathError,
        ("--out and --overlay", "out.png"),
    ),
    ("iterations-negative", BASE + " --iterations -3", ConfigError, ("--iterations", "-3")),
    ("budget-nan", BASE + " --budget nan", ConfigError, ("--budget", "nan")),
    ("budget-negative", BASE + " --budget -2", ConfigError, ("--budget", "-2")),
    ("sigma-zero", BASE + " --sigma-xy 0", ConfigError, ("sigma_xy", "got 0.0")),
    ("sigma-tiny", BASE + " --sigma-rgb 1e-30", ConfigError, ("sigma_rgb", "1e-30")),
    ("weight-nan", BASE + " --w-smooth nan", ConfigError, ("w_smooth", "nan")),
    ("gt-prob", BASE + " --gt-prob 1.5", ConfigError, ("--gt-prob", "1.5")),
    ("threads-zero", BASE + " --threads 0", ConfigError, ("--threads", "0")),
    (
        "image-is-a-folder",
        "{d}/folder {d}/ann.png --out {d}/out.png",
        InputFileError,
        ("image file", "folder", "directory"),
    ),
    (
        "unary-missing",
        "{d}/im.png {d}/gone.npy --out {d}/out.png",
        InputFileError,
        ("unary file", "gone.npy", "does not exist"),
    ),
)


@pytest.mark.parametrize(("template", "error", "where"), CLI_CASES)
def test_cli_checks_before_any_work(template, error, where, cli_files, monkeypatch):
    """Argument, output-path and input-existence errors come before any file is read."""

    def no_reading(*args, **kwargs):
        raise AssertionError("an input was read before the arguments were checked")

    monkeypatch.setattr("crf.__main__.read_image", no_reading)
    args = _parser().parse_args(_argv(template, cli_files))
    with no_side_effects(cli_files), raises_where(error, *where):
        refine(args)


CLI_FILE_CASES = _cases(
    (
        "image-bomb",
        "{d}/bomb.png {d}/ann.png --out {d}/out.png",
        InputFileError,
        ("bomb.png", "decompression bomb"),
    ),
    (
        "jpeg-annotation",
        "{d}/im64.png {d}/scribble.jpg --out {d}/out.png",
        TooManyLabelsError,
        ("scribble.jpg", "JPEG", "cap of 256"),
    ),
    (
        "annotation-vs-image",
        "{d}/im64.png {d}/ann.png --out {d}/out.png",
        ShapeMismatchError,
        ("ann.png", "(12, 14)", "(64, 64)"),
    ),
)


@pytest.mark.parametrize(("template", "error", "where"), CLI_FILE_CASES)
def test_cli_bad_files_write_nothing(template, error, where, cli_files):
    args = _parser().parse_args(_argv(template, cli_files))
    with no_side_effects(cli_files), raises_where(error, *where):
        refine(args)


def test_cli_exit_status_and_message(cli_files, capsys):
    """main() turns the typed error into exit status 2 and one line naming the file."""
    np.save(cli_files / "nan.npy", _with(PROBS, (3, 1, 0), NAN))
    with no_side_effects(cli_files):
        assert main(_argv("{d}/im.png {d}/nan.npy --out {d}/out.png", cli_files)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "nan.npy" in err and "(3, 1, 0)" in err
    # the same command with good probabilities runs and writes both outputs
    assert main(_argv("{d}/im.png {d}/p.npy --out {d}/out.png --iterations 1", cli_files)) == 0
    assert (cli_files / "out.png").is_file() and (cli_files / "out_overlay.png").is_file()


# --- the example ----------------------------------------------------------------------------


def _example():
    spec = importlib.util.spec_from_file_location("crf_refine_example_bad", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE_CASES = _cases(
    ("out-is-a-file", lambda d: _bytes(d / "f.txt", b"x"), ("--out", "f.txt", "is a file")),
    ("out-parent-missing", lambda d: d / "a" / "b", ("--out", "a/b", "does not exist")),
)


@pytest.mark.parametrize(("make", "where"), EXAMPLE_CASES)
def test_example_output_folder(make, where, tmp_path):
    out = make(tmp_path)
    module = _example()
    with no_side_effects(tmp_path), raises_where(OutputPathError, *where):
        module.main(["--synthetic", "--out", str(out)])
    assert not (tmp_path / "a").exists()


# --- tensors (issue 15): checked on their device, same messages -----------------------------

TENSOR_CASES = _cases(
    (
        "probs-nan-index",
        lambda: {"probs": torch.from_numpy(_with(PROBS, (3, 4, 1), NAN))},
        InvalidValueError,
        ("probs", "NaN", "(3, 4, 1)"),
    ),
    (
        "probs-negative-index",
        lambda: {"probs": torch.from_numpy(_with(PROBS, (2, 5, 0), -0.5))},
        InvalidValueError,
        ("probs", "negative", "(2, 5, 0)"),
    ),
    (
        "probs-logits",
        lambda: {"probs": torch.full((H, W, 2), 3.0)},
        InvalidValueError,
        ("probs", "sum to 6.0000", "(y, x) (0, 0)"),
    ),
    (
        "probs-batch-mismatch",
        lambda: {"probs": torch.full((2, H, W, 2), 0.5)},
        ShapeMismatchError,
        ("probs", "(H, W, M)", "(2, 12, 14, 2)"),
    ),
    (
        "unary-inf-index",
        lambda: {"unary": torch.from_numpy(_with(_unary(), (1, 2, 0), INF))},
        InvalidValueError,
        ("unary", "non-finite", "(1, 2, 0)"),
    ),
    (
        "unary-size",
        lambda: {"unary": torch.zeros(H, W + 1, 3)},
        ShapeMismatchError,
        ("unary", "(1, 12, 15)", "(1, 12, 14)"),
    ),
    (
        "image-float-tensor",
        lambda: {"image": torch.rand(H, W, 3), "unary": _unary()},
        InvalidValueError,
        ("image", "torch.float32", "uint8"),
    ),
    (
        "image-range-tensor",
        lambda: {"image": torch.full((H, W, 3), 300, dtype=torch.int32), "unary": _unary()},
        InvalidValueError,
        ("image", "[0, 255]", "300"),
    ),
    (
        "both-unary-and-probs",
        lambda: {"unary": _unary(), "probs": PROBS},
        InvalidValueError,
        ("exactly one of unary", "probs"),
    ),
    ("neither", lambda: {}, InvalidValueError, ("exactly one of unary", "probs")),
)


@pytest.mark.parametrize(("make", "error", "where"), TENSOR_CASES)
def test_tensor_inputs(make, error, where):
    kwargs = make()
    image = kwargs.pop("image", torch.from_numpy(_image()))
    probs = kwargs.get("probs")
    before = None if probs is None or not isinstance(probs, torch.Tensor) else probs.clone()
    with raises_where(error, *where):
        DenseCRF(image, **kwargs)
    if before is not None:  # nothing mutated
        assert torch.equal(before, probs) or torch.isnan(before).any()


# --- refine-dir (issue 15): checked before any work; a bad file is reported and skipped -----


@pytest.fixture
def dir_files(tmp_path) -> Path:
    """tmp_path/img (three images), tmp_path/prob (their probabilities, one corrupt)."""
    (tmp_path / "img").mkdir()
    (tmp_path / "prob").mkdir()
    for i in range(3):
        _save(tmp_path / "img" / f"im{i}.png", _image())
        _npy(tmp_path / "prob" / f"im{i}.npy", PROBS)
    _bytes(tmp_path / "prob" / "im1.npy", b"\x93NUMPY\x01\x00garbage")
    return tmp_path


DIR_CASES = _cases(
    ("images-missing", "{d}/nope {d}/prob --out {d}/out", InputFileError, ("IMAGES", "nope")),
    ("probs-is-a-file", "{d}/img {d}/img/im0.png --out {d}/out", InputFileError, ("PROBS", "im0.png", "not a folder")),
    ("out-is-a-file", "{d}/img {d}/prob --out {d}/img/im0.png", OutputPathError, ("--out", "im0.png", "is a file")),
    ("out-is-input", "{d}/img {d}/prob --out {d}/img", OutputPathError, ("--out", "input folder")),
    ("out-parent-missing", "{d}/img {d}/prob --out {d}/a/b", OutputPathError, ("--out", "does not exist")),
    ("batch-size-zero", "{d}/img {d}/prob --out {d}/out --batch-size 0", ConfigError, ("--batch-size", "0")),
    ("sigma-zero", "{d}/img {d}/prob --out {d}/out --sigma-xy 0", ConfigError, ("sigma_xy", "got 0.0")),
    ("device-bogus", "{d}/img {d}/prob --out {d}/out --device gpu0", ConfigError, ("--device", "gpu0")),
    ("no-images", "{d}/prob {d}/prob --out {d}/out", InputFileError, ("IMAGES", "holds no images")),
)  # fmt: skip


@pytest.mark.parametrize(("template", "error", "where"), DIR_CASES)
def test_refine_dir_checks_before_any_work(template, error, where, dir_files):
    args = _parser().parse_args(["refine-dir", *template.format(d=dir_files).split()])
    with no_side_effects(dir_files), raises_where(error, *where):
        crf.refine_dir.refine_dir(args)
    assert not (dir_files / "out").exists()


def test_refine_dir_duplicate_names(dir_files):
    _save(dir_files / "img" / "im0.bmp", _image())
    args = _parser().parse_args(
        ["refine-dir", *f"{dir_files}/img {dir_files}/prob --out {dir_files}/out".split()]
    )
    with no_side_effects(dir_files), raises_where(InputFileError, "im0.bmp", "share the name"):
        crf.refine_dir.refine_dir(args)


@pytest.mark.parametrize("batch", ["1", "2"])
def test_refine_dir_reports_a_corrupt_file_and_goes_on(dir_files, capsys, batch):
    """One corrupt probability map among three: reported (path and reason), skipped; the other
    two are refined; exit status 1."""
    argv = ["refine-dir", str(dir_files / "img"), str(dir_files / "prob")]
    assert (
        main([*argv, "--out", str(dir_files / "out"), "--batch-size", batch, "--iterations", "2"])
        == 1
    )
    err = capsys.readouterr().err
    assert "im1.npy" in err and "skipped" in err and "refined 2 of 3" in err
    assert sorted(p.name for p in (dir_files / "out").iterdir()) == ["im0.png", "im2.png"]
    np.save(dir_files / "prob" / "im1.npy", PROBS)  # repaired: all three, exit status 0
    assert main([*argv, "--out", str(dir_files / "out2"), "--overlay", "--no-progress"]) == 0
    assert len(list((dir_files / "out2").iterdir())) == 6
