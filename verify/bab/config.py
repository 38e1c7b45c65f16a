"""The settings of branch and bound: `BabConfig` (shared and input-splitting settings) and
`ReluSplitConfig` (ReLU splitting, `BabConfig.relu`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bounds.methods.beta_crown import BetaCrownConfig
from bounds.registry import methods_with
from verify.attack import AttackConfig
from verify.bab.branchers import INPUT_BRANCHINGS, RELU_BRANCHINGS


@dataclass(frozen=True)
class ReluSplitConfig:
    """branching: "babsr" or "fsb" (the top fsb_candidates of BaBSR and of the intercept score,
    each judged by its two children's one-pass bounds); root_iterations: Adam steps on the
    root's slopes; intermediate_iterations: alpha-CROWN steps tightening the root's intermediate
    bounds (0: CROWN's), within intermediate_share of the time left; iterations: Adam steps per
    child batch (warm-started from the parent); lr_alpha, lr_beta: Adam's steps; final_iterations:
    Adam steps for a domain with nothing left to split; max_memory_gb: the open domains' slopes
    and multipliers beyond which the answer is "unknown" (with `BabConfig.max_domains`);
    prox_iterations: iterations of the hard-domain bounder on the children of depth >=
    prox_min_depth that alpha-beta-CROWN leaves open (0: off; see `verify.bab.relu.stratified.HardBounder`);
    hard_bounder: that bounder, "prox" (the Planet relaxation by the proximal method: sweeps)
    or "active-set" (the Anderson relaxation, tighter than Planet: Adam steps; ReLU chains);
    hard_stall: the stratification (De Palma et al. 2021, "Scaling the convex barrier with
    active sets", Sec. 5: the expensive bounder on the subtrees predicted hard): a domain goes
    to the hard bounder only once its bound has improved by less than stall_gain (relative to
    its parent's margin) over each of its last hard_stall splits (0: every open domain of depth
    >= prox_min_depth); root_intermediate: after alpha-CROWN, the root's intermediate bounds
    are tightened by this dual solver ("alpha-crown": no further stage; "active-set",
    "sp-fw": the Anderson relaxation; "prox": Planet's), root_intermediate_iterations per
    layer, within root_share of the time left (it runs only when alpha-CROWN's root bound
    leaves a polytope open and no counterexample is known; graphs the solver cannot take skip
    it); hard_warm_start: the active-set hard bounder keeps the duals and cuts of the domains it
    bounds and their descendants start from them (`verify.bab.relu.warm`), at most
    hard_warm_memory_gb of them (the oldest dropped beyond).
    Defaults measured on mnist_fc (FSB beat BaBSR there; 5 steps per child beat 10 and 20; the
    Anderson root bounds: 66 solved instead of 63 at 5% of the timeouts, none lost, and 4 more
    of the rest at the full timeouts: `benchmarks/results/vnncomp_mnist_fc_root_bounds.md`)."""

    branching: str = "fsb"
    fsb_candidates: int = 3
    root_iterations: int = 50
    intermediate_iterations: int = 20
    intermediate_share: float = 0.2
    iterations: int = 5
    lr_alpha: float = 0.1
    lr_beta: float = 0.05
    final_iterations: int = 300
    max_memory_gb: float = 4.0
    prox_iterations: int = 0
    prox_min_depth: int = 1
    hard_bounder: str = "prox"
    hard_stall: int = 0
    stall_gain: float = 0.05
    root_intermediate: str = "active-set"
    root_intermediate_iterations: int = 60
    root_share: float = 0.5
    hard_warm_start: bool = True
    hard_warm_memory_gb: float = 1.0

    def __post_init__(self) -> None:
        hard = methods_with("hard_bounder")
        if self.hard_bounder not in hard:
            raise ValueError(f"hard_bounder must be one of {hard}, got {self.hard_bounder!r}")
        if self.branching not in RELU_BRANCHINGS.names():
            names = RELU_BRANCHINGS.names()
            raise ValueError(f"branching must be one of {names}, got {self.branching!r}")
        if self.fsb_candidates < 1 or not 0 <= self.intermediate_share <= 1:
            raise ValueError("need fsb_candidates >= 1 and 0 <= intermediate_share <= 1")
        counts = (self.root_iterations, self.intermediate_iterations, self.iterations,
                  self.prox_iterations, self.prox_min_depth, self.hard_stall)  # fmt: skip
        if min(*counts, self.final_iterations) < 0 or not (self.lr_alpha > 0 and self.lr_beta > 0):
            raise ValueError("iteration counts must be >= 0 and learning rates > 0")
        if not (self.max_memory_gb > 0 and self.hard_warm_memory_gb > 0):
            raise ValueError("max_memory_gb and hard_warm_memory_gb must be > 0")
        if not self.stall_gain >= 0:
            raise ValueError("stall_gain must be >= 0")
        root = ("alpha-crown", *methods_with("root_intermediate"))
        if self.root_intermediate not in root:
            raise ValueError(
                f"root_intermediate must be one of {root}, got {self.root_intermediate!r}"
            )
        if self.root_intermediate_iterations < 0 or not 0 < self.root_share <= 1:
            raise ValueError("need root_intermediate_iterations >= 0 and 0 < root_share <= 1")

    def bound_config(self, iterations: int) -> BetaCrownConfig:
        """alpha-beta-CROWN's settings for `iterations` Adam steps."""
        return BetaCrownConfig(iterations=iterations, lr_alpha=self.lr_alpha, lr_beta=self.lr_beta)


SPLITTINGS = ("auto", "input", "relu")

TRIAL_SCORES = {
    "max": lambda margins: margins.amax(dim=1),
    "sum": lambda margins: margins.sum(dim=1),
    "min": lambda margins: margins.amin(dim=1),
}


@dataclass(frozen=True)
class PortfolioConfig:
    """probe: the fraction of the region's time the favoured search runs alone (then as long
    as it is predicted to finish), the time the other's root may take, and the least each
    search runs before the shares follow the measurements; floor: the least share of a search
    still running; prior: the favoured search's share before any measurement
    (`verify.bab.portfolio`)."""

    probe: float = 0.1
    floor: float = 0.05
    prior: float = 0.9

    def __post_init__(self) -> None:
        if not (0 < self.probe < 1 and 0 < self.floor < 0.5 and 0.5 <= self.prior < 1):
            raise ValueError("need 0 < probe < 1, 0 < floor < 0.5 and 0.5 <= prior < 1")


@dataclass(frozen=True)
class BabConfig:
    """method: bounds for every domain, unless fast_method (None: off), timed against it on
    the region's box, is at least fast_ratio times faster there (input splitting on at most
    fast_max_inputs inputs; `InputBounder.choose`); strong_method (None: off) for domains at depth >=
    strong_depth, with strong_options; batch_size: first domains per bounds call, adapted by
    measured throughput between min_batch and max_batch (halved on out-of-memory); branching:
    "smear" (|gradient| x width of the critical row at the centre) or "widest" (normalised
    width); trial_dims: split each parent on its top-k dimensions by that score, bound all 2k
    children and keep the pair whose trial_score ("max", "sum" or "min" of the two children's
    margins clipped at 0) is largest (k = 1: no trial; "max" favours the split that prunes or
    nearly prunes one half); attack_every: seconds between PGD runs on the attack_domains
    worst open domains; corner_domains: open domains whose corners are tried (inputs of at most
    6 dimensions); max_domains: open domains beyond which the answer is "unknown";
    prune_tol: without the float64 recheck, a domain is pruned when its margin exceeds
    prune_tol * (1 + |b|) (rounding); with it, when the recheck's margin exceeds recheck_tol *
    (1 + |b|) (0: any margin > 0 that sound bound gives; `common.prune_tolerance`);
    float64_recheck: closing bounds are evaluated again in float64, their rounding tracked,
    before a domain is pruned (off only to measure what it costs: rounding can then prune a
    domain that holds a counterexample; see `common.Float64Check`); root_float64: with the
    recheck on, input splitting bounds the region's box once in float64, with its rounding,
    instead of in float32 and again to recheck (`InputBounder.root64`); clip: that float64
    bound's linear functionals also clip the region's box to where a counterexample can lie
    (`verify.bab.input.clip`). splitting: "input", "relu" or "auto" (on a ReLU network both, as a portfolio,
    `verify.bab.portfolio`, favouring input splitting for at most input_split_max_dims inputs
    and ReLU splitting otherwise; input splitting on other networks); portfolio: its
    settings; relu: the
    ReLU-splitting settings (`method`, `strong_*`, `branching`, `trial_*` and `corner_domains`
    are input-splitting settings; the rest is shared); combine_rows: input splitting also
    bounds the midpoints of pairs of a polytope's rows (`UnsafeSpec.with_combinations`)."""

    method: str = "crown"
    fast_method: str | None = "forward"
    fast_ratio: float = 1.5
    fast_max_inputs: int = 64
    strong_method: str | None = "alpha-crown"
    strong_depth: int = 30
    strong_options: dict[str, Any] = field(
        default_factory=lambda: {"iterations": 10, "optimize_intermediate": False}
    )
    batch_size: int = 128
    min_batch: int = 16
    max_batch: int = 2048
    branching: str = "smear"
    trial_dims: int = 5
    trial_score: str = "max"
    attack_every: float = 1.0
    attack_domains: int = 32
    corner_domains: int = 256
    attack: AttackConfig = field(default_factory=lambda: AttackConfig(restarts=32, steps=30))
    max_domains: int = 2_000_000
    prune_tol: float = 1e-5
    float64_recheck: bool = True
    recheck_tol: float = 0.0
    root_float64: bool = True
    clip: bool = False
    splitting: str = "auto"
    input_split_max_dims: int = 12
    relu: ReluSplitConfig = field(default_factory=ReluSplitConfig)
    portfolio: PortfolioConfig = field(default_factory=PortfolioConfig)
    combine_rows: bool = True

    def __post_init__(self) -> None:
        if self.branching not in INPUT_BRANCHINGS.names():
            names = INPUT_BRANCHINGS.names()
            raise ValueError(f"branching must be one of {names}, got {self.branching!r}")
        if self.fast_ratio < 1 or self.fast_max_inputs < 0:
            raise ValueError("need fast_ratio >= 1 and fast_max_inputs >= 0")
        if self.trial_dims < 1 or self.trial_score not in TRIAL_SCORES:
            raise ValueError(f"need trial_dims >= 1 and trial_score in {sorted(TRIAL_SCORES)}")
        if not 1 <= self.min_batch <= self.batch_size <= self.max_batch:
            raise ValueError("need 1 <= min_batch <= batch_size <= max_batch")
        if min(self.strong_depth, self.attack_every, self.prune_tol, self.recheck_tol) < 0:
            raise ValueError("strong_depth, attack_every, prune_tol and recheck_tol must be >= 0")
        if self.splitting not in SPLITTINGS:
            raise ValueError(f"splitting must be one of {SPLITTINGS}, got {self.splitting!r}")
