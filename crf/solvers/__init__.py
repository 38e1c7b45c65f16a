"""Dense-CRF MAP solvers; each is a function ``solve(model, init, config) -> SolverResult``.

- :mod:`crf.solvers.meanfield`: mean-field (Krahenbuhl and Koltun, NIPS 2011).
- :mod:`crf.solvers.qp_frank_wolfe`: convex QP relaxation by Frank-Wolfe (Desmaison et al. 2016).
- :mod:`crf.solvers.dc_neg`: DC relaxation with the negative-semidefinite split, CCCP (ibid.).
- :mod:`crf.solvers.lp_proximal`: LP relaxation by a proximal method (Ajanthan et al. 2017).
"""

from crf.solvers.common import SOLVERS, SolverResult
from crf.solvers.dc_neg import DCNegConfig
from crf.solvers.lp_proximal import LPConfig
from crf.solvers.meanfield import MeanFieldConfig
from crf.solvers.qp_frank_wolfe import QPConfig

__all__ = ["SOLVERS", "DCNegConfig", "LPConfig", "MeanFieldConfig", "QPConfig", "SolverResult"]
