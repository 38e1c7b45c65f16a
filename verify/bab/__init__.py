"""Branch and bound on one VNN-LIB region (Bunel et al. 2020, "Branch and bound for piecewise
linear neural network verification", JMLR).

- `search.py`: the one search (`Search`: its loop `run` and step `step`), composed of a
  bounder, a brancher, an attacker and a clock; the counterexample checks;
- `protocols.py`: the `Bounder`, `Brancher` and `Attacker` roles the search is written over;
- `common.py`: the domain batches, the batch sizer, the float64 recheck and the outcome;
- `branchers.py`: the branching heuristics by name;
- `input/`: input splitting (boxes), `RegionBab`: domains, bounder (the bound methods through
  their registry, `input/methods.py`), brancher (smear, widest), search;
- `relu/`: ReLU splitting (alpha-beta-CROWN, optionally stratified with a tighter bounder on the
  domains predicted hard; BaBSR and FSB), `ReluBab`: domains, root bounds, bounder, hard
  bounder, stratified bounder, branching, brancher, warm starts, search;
- `config.py`: `BabConfig` and `ReluSplitConfig`.

`solve_region` builds the network's graph once and runs on it the search `config.splitting`
names, or with "auto" on a ReLU network both, as a portfolio (`portfolio.py`: the one the input
count favours first, then turns by measured progress); a network with other activations is
split on its inputs.
"""

from __future__ import annotations

from torch import nn

from bounds.graph.graph import Graph, build_graph
from verify.bab.common import BatchSizer, RegionOutcome
from verify.bab.config import SPLITTINGS, BabConfig, ReluSplitConfig
from verify.bab.input.domains import Domains
from verify.bab.input.search import RegionBab
from verify.bab.portfolio import Lane, Portfolio, PortfolioConfig
from verify.bab.relu.domains import ReluDomains, relu_graph, relu_only
from verify.bab.relu.search import ReluBab
from verify.property import Region

SEARCHES: dict[str, type[RegionBab] | type[ReluBab]] = {"input": RegionBab, "relu": ReluBab}

__all__ = [
    "SPLITTINGS",
    "BabConfig",
    "BatchSizer",
    "Domains",
    "PortfolioConfig",
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
    inputs or ReLUs as `config.splitting` says (see `splitting_mode`); the network's graph is
    built once, here, and given to the search."""
    config = config or BabConfig()
    graph = build_graph(net, input_shape(net, region))
    if config.splitting == "auto" and relu_graph(graph):
        return portfolio(net, region, config, seed, graph).run(deadline)
    search = SEARCHES[splitting_mode(net, region, config, graph)]
    return search(net, region, config, seed, graph).run(deadline)


def portfolio(net: nn.Module, region: Region, config: BabConfig, seed: int,
              graph: Graph) -> Portfolio:  # fmt: skip
    """Input and ReLU splitting on `region` as a `Portfolio`, the one `splitting_mode` names
    first (favoured by the input count: `config.portfolio.prior`)."""
    first = splitting_mode(net, region, config, graph)
    order = [first, "relu" if first == "input" else "input"]
    priors = [config.portfolio.prior, 1 - config.portfolio.prior]
    lanes = [Lane(name, SEARCHES[name](net, region, config, seed, graph), prior)
             for name, prior in zip(order, priors)]  # fmt: skip
    return Portfolio(lanes, config.portfolio, bool(region.unsafe))


def input_shape(net: nn.Module, region: Region) -> tuple[int, ...]:
    """The network's input shape (its `input_shape`, else the region's flat one)."""
    return tuple(getattr(net, "input_shape", None) or (len(region.lower),))


def splitting_mode(
    net: nn.Module, region: Region, config: BabConfig, graph: Graph | None = None
) -> str:
    """The splitting mode, "input" or "relu": `config.splitting` unless "auto", which splits
    inputs when there are at most `config.input_split_max_dims` of them (a few input splits
    tighten bounds a lot there) or when the network has other activations than ReLU, and ReLUs
    otherwise (`graph`: the network's when the caller has built it). With "auto", the mode the
    portfolio runs first (`solve_region`), and the one mode of certificates and Ray shards."""
    if config.splitting != "auto":
        return config.splitting
    if len(region.lower) <= config.input_split_max_dims:
        return "input"
    relu = relu_only(net, len(region.lower)) if graph is None else relu_graph(graph)
    return "relu" if relu else "input"
