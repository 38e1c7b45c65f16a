"""The command line's options: argument types (each validated before any work, a bad one is an
argparse error naming it), the options `run` and `run-all` share (`add_common`), and what they
turn into (the network on its device, the branch-and-bound settings, whether Ray is asked for).
Used by `verify.cli.main`, `verify.cli.suite` and `verify.cli.faults`."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path

import torch

from bounds.errors import VerificationInputError
from bounds.registry import available_methods, methods_with
from verify.bab import SPLITTINGS, BabConfig, ReluSplitConfig
from verify.bab.branchers import INPUT_BRANCHINGS
from verify.distributed.cluster import require_ray
from verify.io.onnx_loader import load_onnx
from verify.product import product_network
from verify.property import VnnlibProperty

DEFAULT_METHOD = "crown"


def resolve(root: Path, name: str) -> Path:
    """`root/name`, or its `.gz` sibling when only that exists."""
    path = root / name
    gz = path.with_name(path.name + ".gz")
    return gz if not path.exists() and gz.exists() else path


def seconds_option(text: str) -> float:
    """A finite number of seconds > 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be finite and > 0, got {text!r}")
    return value


def count_option(minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value

    return parse


def method_option(text: str) -> str:
    if text not in available_methods():
        known = ", ".join(available_methods())
        raise argparse.ArgumentTypeError(f"unknown method {text!r}; available: {known}")
    return text


def device_option(text: str) -> str:
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device on this machine")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"{text!r}: only cpu and cuda devices are supported")
    return text


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--method",
        type=method_option,
        help=f"bound method per input-split domain (default {DEFAULT_METHOD}, or forward where "
        "it is at least 1.5 times as fast on the region's box, for at most 64 inputs); ReLU "
        "splitting always uses alpha-beta-CROWN, so --method with --splitting relu is an error",
    )
    parser.add_argument(
        "--splitting",
        choices=SPLITTINGS,
        default="auto",
        help="branch on inputs, on ReLUs, or auto (the default): on a ReLU network both, "
        "interleaved by measured progress, the one the input count favours first (inputs for "
        "at most 12); inputs on other networks",
    )
    parser.add_argument(
        "--input-branching",
        choices=INPUT_BRANCHINGS.names(),
        default=BabConfig.branching,
        help="input splitting: the dimension to halve, by |coefficient| x width of the "
        "critical row's linear bound (smart), by |gradient| x width at the box's centre "
        f"(smear) or by normalised width (widest); default {BabConfig.branching}",
    )
    parser.add_argument(
        "--clip",
        action=argparse.BooleanOptionalAction,
        default=BabConfig.clip,
        help="input splitting: clip the region's box to where a counterexample can lie, by "
        "the root's float64 linear bounds (default off: no gain measured on ACAS Xu and the "
        "bias-field nets)",
    )
    add_relu_splitting(parser)
    parser.add_argument(
        "--workers",
        type=count_option(1),
        help="worker processes on a Ray cluster (default 1: this process, no Ray); run-all "
        "spreads the instances over them, run shards the instance; with --ray, the default is "
        "the cluster's CPUs over --threads",
    )
    parser.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="join this Ray cluster (e.g. auto or HOST:6379) instead of starting a local one",
    )
    parser.add_argument(
        "--threads", type=count_option(1), default=1, help="torch threads (1; per worker)"
    )
    parser.add_argument(
        "--device", type=device_option, default="cpu", help="torch device of the network (cpu)"
    )


def add_relu_splitting(parser: argparse.ArgumentParser) -> None:
    """The options of ReLU splitting (`ReluSplitConfig`)."""
    parser.add_argument(
        "--prox-sweeps",
        type=count_option(0),
        default=ReluSplitConfig.prox_iterations,
        help="ReLU splitting: iterations of the hard-domain bounder (--hard-bounder) on the "
        f"domains alpha-beta-CROWN leaves open (0: off; default {ReluSplitConfig.prox_iterations})",
    )
    parser.add_argument(
        "--hard-bounder",
        choices=methods_with("hard_bounder"),
        default=ReluSplitConfig.hard_bounder,
        help="ReLU splitting: the bounder of --prox-sweeps: prox (Planet relaxation) or "
        "active-set (Anderson relaxation, tighter; ReLU chains) "
        f"(default {ReluSplitConfig.hard_bounder})",
    )
    parser.add_argument(
        "--hard-stall",
        type=count_option(0),
        default=ReluSplitConfig.hard_stall,
        help="ReLU splitting: give a domain to the hard-domain bounder only once its bound has "
        "improved little over this many splits in a row (the hard-subtree predictor; 0: every "
        f"open domain; default {ReluSplitConfig.hard_stall})",
    )
    parser.add_argument(
        "--hard-warm-start",
        action=argparse.BooleanOptionalAction,
        default=ReluSplitConfig.hard_warm_start,
        help="ReLU splitting with --hard-bounder active-set: children start from the duals and "
        "cuts of their parent's hard bound where that is better than their slopes "
        f"(default {ReluSplitConfig.hard_warm_start})",
    )
    parser.add_argument(
        "--root-bounds",
        choices=("alpha-crown", *methods_with("root_intermediate")),
        default=ReluSplitConfig.root_intermediate,
        help="ReLU splitting: after alpha-CROWN, tighten the root's intermediate bounds by this "
        "dual solver (active-set, sp-fw: the Anderson relaxation, tighter than Planet; prox: "
        f"Planet's), within half the time left; alpha-crown: no further stage (default "
        f"{ReluSplitConfig.root_intermediate})",
    )


def check_output_file(path: Path, option: str) -> None:
    """`path` can be written: its folder exists and it is not a folder (checked before work)."""
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise VerificationInputError(f"{option} {path} is a folder, not a file")
    if not folder.is_dir():
        raise VerificationInputError(f"{option} {path}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK):
        raise VerificationInputError(f"{option} {path}: the folder {folder} is not writable")


def load_network(path: Path, device: str) -> torch.nn.Module:
    return load_onnx(path).to(device).eval()


NETWORKS_SEPARATOR = ";"  # several networks in one argument or CSV cell (VNN-LIB 2.0 properties)


def network_paths(root: Path, text: str) -> list[Path]:
    """The network paths of an argument or CSV cell (`a.onnx;b.onnx`: several, in the order
    the property declares its networks), each resolved as `resolve` does."""
    return [resolve(root, part.strip()) for part in text.split(NETWORKS_SEPARATOR)]


def load_networks(paths: list[Path], device: str, prop: VnnlibProperty) -> torch.nn.Module:
    """The network, or for a property over several networks their product
    (`verify.product`), loaded from `paths`."""
    nets = [load_network(p, device) for p in paths]
    if len(nets) == 1 and not prop.networks:
        return nets[0]
    return product_network(nets, prop)


def bab_config(args: argparse.Namespace) -> BabConfig:
    """The branch-and-bound settings the options change (the rest: defaults)."""
    sweeps = getattr(args, "prox_sweeps", ReluSplitConfig.prox_iterations)
    bounder = getattr(args, "hard_bounder", ReluSplitConfig.hard_bounder)
    stall = getattr(args, "hard_stall", ReluSplitConfig.hard_stall)
    root = getattr(args, "root_bounds", ReluSplitConfig.root_intermediate)
    warm = getattr(args, "hard_warm_start", ReluSplitConfig.hard_warm_start)
    relu = ReluSplitConfig(prox_iterations=sweeps, hard_bounder=bounder, hard_stall=stall,
                           root_intermediate=root, hard_warm_start=warm)  # fmt: skip
    branching = getattr(args, "input_branching", BabConfig.branching)
    clip = getattr(args, "clip", BabConfig.clip)
    return BabConfig(relu=relu, branching=branching, clip=clip)


def check_method(args: argparse.Namespace) -> None:
    """`--method` only applies to input splitting: refuse it with `--splitting relu`, where
    ReLU splitting alone runs ("auto" also runs input splitting, with `--method`, beside ReLU
    splitting on ReLU networks)."""
    if args.method is not None and args.splitting == "relu":
        raise VerificationInputError(
            f"--method {args.method} applies to input splitting only; this instance is verified "
            "by ReLU splitting, which bounds its domains with alpha-beta-CROWN (drop --method "
            "or pass --splitting input)"
        )


def distributed(args: argparse.Namespace) -> bool:
    """Whether the options ask for Ray (more than one worker, or a cluster address); then Ray
    must be importable (`RayUnavailableError` naming the option, before any work)."""
    if (args.workers or 1) == 1 and args.ray is None:
        return False
    require_ray(f"--workers {args.workers}" if args.ray is None else f"--ray {args.ray}")
    return True
