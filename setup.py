"""Neural-network verification and bounds toolkit (packages: verify, bounds, relaxations, crf, kernels)."""

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="ldverify",
    version="0.1.0",
    description="Sound bounds and verification for neural networks; dense CRF MAP inference.",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["verify*", "bounds*", "relaxations*", "crf*", "kernels*"]),
    install_requires=[
        "torch>=2.11,<2.14",
        "numpy>=1.24",
        "scipy>=1.10",
        "onnx>=1.15",
    ],
    extras_require={
        "lp": ["cvxpy>=1.5", "highspy>=1.7", "clarabel>=0.7"],
        "examples": ["scikit-learn>=1.3"],
        "crf": ["pillow>=10"],
        # VNN-LIB 2.0 files (verify/io/vnnlib2.py); 1.0 files need nothing extra.
        "vnnlib2": ["vnnlib>=1.0.2"],
        # Suites and hard instances over Ray workers (verify/distributed; --workers, --ray).
        "distributed": ["ray>=2.40"],
        "bench": [
            "matplotlib>=3.7",
            "scikit-learn>=1.3",
            "scikit-image>=0.22",
            "cvxpy>=1.5",
            "highspy>=1.7",
            "pillow>=10",
        ],
        # The docs site (mkdocs.yml, docs/): `mkdocs build --strict`, the API from the docstrings.
        "docs": [
            "mkdocs>=1.6",
            "mkdocs-material>=9.5",
            "mkdocstrings[python]>=0.26",
            "mkdocstrings-python>=1.12",
            "matplotlib>=3.7",
        ],
        # Peers compared in benchmarks (pydensecrf2 builds from source, about a minute).
        "peers": ["pydensecrf2"],
        "dev": [
            "cvxpy>=1.5",
            "highspy>=1.7",
            "clarabel>=0.7",
            "scikit-learn>=1.3",
            "matplotlib>=3.7",
            "onnxruntime>=1.16",
            "pytest>=8",
            "pytest-timeout>=2.2",
            "hypothesis>=6",
            "mpmath>=1.3",  # high-precision checks of the relaxations (comes with torch via sympy)
            "ruff>=0.5",
            "pillow>=10",
            # The Triton kernels' tests run under its CPU interpreter (TRITON_INTERPRET=1).
            "triton>=3.5; platform_system == 'Linux'",
            "vnnlib>=1.0.2",
        ],
    },
    entry_points={"console_scripts": ["verify=verify.__main__:main"]},
)
