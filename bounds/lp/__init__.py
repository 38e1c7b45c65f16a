"""Exact references by off-the-shelf solvers: the Planet LP and the MILP (`lp`), and the
Anderson et al. LP/MILP (`anderson_lp`)."""
