"""Branch and bound on one VNN-LIB region (Bunel et al. 2020, "Branch and bound for piecewise
linear neural network verification", JMLR).

- `common.py`: the one search loop (`RegionSearch.run`) and step (`RegionSearch.step`), the
  domain batches, the batch sizer, the float64 recheck and the outcome;
- `protocols.py`: the `Bounder` and `Brancher` roles the step is written over;
- `input_split.py`: input splitting (boxes), `RegionBab`;
- `relu_split.py` and `relu_branching.py`: ReLU splitting (alpha-beta-CROWN, optionally
  stratified with a tighter bounder on the domains predicted hard; BaBSR and FSB), `ReluBab`;
- `config.py`: `BabConfig` and `ReluSplitConfig`.

`solve_region` picks input or ReLU splitting (`splitting_mode`).
"""

from __future__ import annotations

from torch import nn

from verify.bab.common import BatchSizer, RegionOutcome
from verify.bab.config import SPLITTINGS, BabConfig, ReluSplitConfig
from verify.bab.input_split import Domains, RegionBab
from verify.bab.relu_split import ReluBab, ReluDomains, relu_only
from verify.property import Region

__all__ = [
    "SPLITTINGS",
    "BabConfig",
    "BatchSizer",
    "Domains",
    "RegionBab",
    "RegionOutcome",
    "ReluBab",
    "ReluDomains",
    "ReluSplitConfig",
    "solve_region",
    "splitting_mode",
]


def solve_region(
    net: nn.Module, region: Region, deadline: float, config: BabConfig | None = None, seed: int = 0
) -> RegionOutcome:
    """Branch and bound on `region` until `deadline` (`time.monotonic()` seconds), splitting
    inputs or ReLUs as `config.splitting` says (see `splitting_mode`)."""
    config = config or BabConfig()
    if splitting_mode(net, region, config) == "relu":
        return ReluBab(net, region, config).run(deadline)
    return RegionBab(net, region, config, seed).run(deadline)


def splitting_mode(net: nn.Module, region: Region, config: BabConfig) -> str:
    """The splitting mode, "input" or "relu": `config.splitting` unless "auto", which splits
    inputs when there are at most `config.input_split_max_dims` of them (a few input splits
    tighten bounds a lot there) or when the network has other activations than ReLU, and ReLUs
    otherwise."""
    if config.splitting != "auto":
        return config.splitting
    if len(region.lower) <= config.input_split_max_dims or not relu_only(net, len(region.lower)):
        return "input"
    return "relu"
