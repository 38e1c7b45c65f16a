"""The house's rules, measured from the source (`benchmarks/structure.py`): no import circle,
not even one hidden by an import inside a function; no import of our own modules inside a
function; no library file over 500 lines, no function over 80 (its docstring not counted);
at least 95% of public
functions fully annotated. And the measurement itself finds what it should."""

from __future__ import annotations

import textwrap
from pathlib import Path

from benchmarks import structure


def test_no_import_circles() -> None:
    s = structure.measure()
    assert s.circles == [], s.circles
    assert s.hidden_circles == [], s.hidden_circles


def test_packages_import_one_way() -> None:
    """verify -> bounds -> relaxations; crf -> kernels; bounds -> kernels; nothing upward."""
    assert structure.measure().layer_violations == []


def test_no_imports_of_our_modules_inside_functions() -> None:
    assert structure.measure().inner_imports == []


def test_no_file_over_500_lines_nor_function_over_80() -> None:
    s = structure.measure()
    assert s.files_over_500 == []
    assert s.functions_over_80 == []


def test_public_functions_are_typed() -> None:
    s = structure.measure()
    assert s.typed_share >= 0.95, (s.typed_public_functions, s.public_functions)


def _package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_measurement_finds_circles_inner_imports_and_untyped_functions(tmp_path) -> None:
    _package(
        tmp_path,
        {
            "verify/__init__.py": "",
            "verify/a.py": "from verify.b import g\n\ndef f(x: int) -> int:\n    return g(x)\n",
            "verify/b.py": "def g(x):\n    from verify.a import f\n    return f(x)\n",
            "bounds/__init__.py": "",
            "bounds/c.py": "from bounds import d\n",
            "bounds/d.py": "from bounds.c import *\n",
            "relaxations/e.py": "import bounds.c\n",
            "relaxations/__init__.py": "",
            "crf/__init__.py": "",
            "kernels/__init__.py": "",
        },
    )
    s = structure.measure(tmp_path)
    assert s.circles == [["bounds.c", "bounds.d"]]
    assert s.hidden_circles == [["verify.a", "verify.b"]]
    assert s.inner_imports == ["verify/b.py:2 -> verify.a"]
    assert s.layer_violations == ["relaxations.e -> bounds.c"]
    assert (s.public_functions, s.typed_public_functions) == (2, 1)
