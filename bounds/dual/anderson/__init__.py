"""The Anderson et al. relaxation of an affine layer followed by a ReLU, its dual, and the
separation oracle (Anderson, Huchette, Ma, Tjandraatmadja, Vielma, "Strong mixed-integer
programming formulations for trained neural networks", Math. Prog. 2020, Thm. 1; De Palma,
Behl, Bunel, Torr, Kumar, "Scaling the Convex Barrier with Active Sets", ICLR 2021, Sec. 3,
and JMLR 2024, arXiv 2101.05844, Sec. 3).

Notation (`../shared/ALGORITHMS.md`, Sec. 1b): hidden layer k (0-based here) computes
`xh_k = W_k x_{k-1} + b_k` from the flat input `x_{-1}` or the previous ReLU output, and
`x_k = relu(xh_k)`; the output is `W_H x_{H-1} + b_H`. Post-activation boxes `lb_k, ub_k` (the
input box for the input). Per weight, `L_ij` is the end of input j's box that minimises
`W_ij x_j` and `U_ij` the one that maximises it. Every neuron of hidden layer k gets
`z in [0, 1]`, with `x >= xh`, `x` in `[lb, ub]` and, for every subset `I` of its inputs,

    x <= sum_{j in I} W_ij x_{k-1,j} + kappa_I + zeta_I z,                          (A_I)
    kappa_I = -sum_{j in I} W_ij L_ij,  zeta_I = b_i + sum_{j not in I} W_ij U_ij + sum_{j in I} W_ij L_ij.

The convex hull of the neuron over its input box is cut out by all of them. Two of them, with
the pre-activation bounds `l, u` put in, are the Big-M form, whose optimum is Planet's:
`x <= u z` (`I = {}`, kappa 0, zeta u) and `x <= xh - l (1 - z)` (`I = all`, kappa `b - l`,
zeta `l`). Every (x, z) of the network (`z = 1[xh >= 0]`) satisfies all of them.

Dual (multipliers `alpha >= 0` on `x >= xh`, `beta >= 0` per constraint): the Lagrangian is
linear in `x` and `z` over boxes, so every `(alpha, beta) >= 0` gives the valid lower bound

    d = c . b_H + sum_k alpha_k . b_k - sum_{k, I} beta_{k,I} . kappa_{k,I}
        + sum_k min_{x_k in [lb_k, ub_k]} f_k . x_k - sum_k 1 . [g_k]_+,
    f_k = above_k - alpha_k + sum_I beta_{k,I},   g_k = sum_I beta_{k,I} zeta_{k,I},
    above_k = W_{k+1}^T alpha_{k+1} - sum_I (W_{k+1} . I)^T beta_{k+1,I}   (c for alpha_H),

with `f` on the input from layer 0's terms alone. The inner minimiser is `x* = lb` where
`f >= 0` else `ub`, `z* = 1[g >= 0]`; the supergradients are the constraints' slacks there.
Anderson cuts are stored per neuron as a mask over its inputs (`Cuts`), the Big-M pair as
plain tensors. The batch is `[B, S]`: problems (boxes) times specifications.

Modules: `problem` (the chain as `Layers`, `AndersonProblem`), `cuts` (`Cuts`, `CutTerms`),
`separation` (the oracle and the choice of cuts), `evaluation` (`AndersonDuals`, the dual
value, its minimiser and supergradient), `certified` (the value as a bound that holds in
floating point).
"""
