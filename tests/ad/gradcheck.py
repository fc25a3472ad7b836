"""Finite-difference oracle for kernel adjoints (float64, central differences)."""

from __future__ import annotations

import numpy as np

import tapegrad as tg


def _copy(args):
    return [a.copy() if isinstance(a, np.ndarray) else a for a in args]


def kernel_vjp_error(cfg, args, ndrange, wrt=(), outputs=(), active=(), eps=1e-6, seed=0,
                     functional=False):
    """Largest relative difference between reverse mode and finite differences.

    The loss is ``sum_k <w_k, args[k] after the launch>`` for k in ``outputs`` with random
    weights ``w_k``; reverse mode gets ``w_k`` as the outputs' shadows.  ``wrt`` are array
    arguments, ``active`` float scalars.  Returns (error, derivs, shadows) so tests can also
    check the Enzyme semantics of the shadows.  With ``functional``, the functional form
    (``accumulate=False``, gradients starting as NaN, seeds that must come back unchanged) is
    checked against the same finite differences too.
    """
    rng = np.random.default_rng(seed)
    weights = {k: rng.standard_normal(np.shape(args[k])) for k in outputs}

    def loss(values):
        values = _copy(values)
        cfg(*values, ndrange=ndrange)
        return sum(float(np.sum(weights[k] * values[k])) for k in outputs)

    values = _copy(args)
    shadows, annotated = {}, []
    for k, x in enumerate(values):
        if k in wrt or k in outputs:
            shadows[k] = weights[k].copy() if k in outputs else np.zeros_like(x)
            annotated.append(tg.Duplicated(x, shadows[k]))
        elif k in active:
            annotated.append(tg.Active(x))
        else:
            annotated.append(x)
    (derivs,) = tg.autodiff(tg.Reverse, cfg, tg.Const, *annotated, ndrange=ndrange)
    checks = [(shadows, derivs, "")]
    if functional:
        values = _copy(args)
        fresh, annotated = {}, []
        for k, x in enumerate(values):
            if k in outputs:
                fresh[k] = weights[k].copy()
                annotated.append(tg.DuplicatedNoNeed(x, fresh[k]))
            elif k in wrt:
                fresh[k] = np.full_like(x, np.nan)
                annotated.append(tg.Duplicated(x, fresh[k]))
            elif k in active:
                annotated.append(tg.Active(x))
            else:
                annotated.append(x)
        (got,) = tg.autodiff(tg.Reverse, cfg, tg.Const, *annotated, ndrange=ndrange,
                             accumulate=False)
        for k in outputs:
            assert np.array_equal(fresh[k], weights[k]), "accumulate=False changed a seed"
        checks.append((fresh, got, " (accumulate=False)"))
    worst = 0.0
    for shadows, derivs, form in checks:
        worst = max(worst, _compare(args, loss, shadows, derivs, wrt, active, eps, form))
    return worst, checks[0][1], checks[0][0]


def _compare(args, loss, shadows, derivs, wrt, active, eps, form):
    worst = 0.0
    for k in wrt:
        fd = np.zeros(np.shape(args[k]))
        for idx in np.ndindex(fd.shape):
            plus, minus = _copy(args), _copy(args)
            plus[k][idx] += eps
            minus[k][idx] -= eps
            fd[idx] = (loss(plus) - loss(minus)) / (2 * eps)
        err = float(np.abs(shadows[k] - fd).max() / max(1.0, np.abs(fd).max()))
        assert err < 1e-5, \
            f"argument {k}{form}: reverse {shadows[k]} vs finite differences {fd}"
        worst = max(worst, err)
    for k in active:
        plus, minus = _copy(args), _copy(args)
        plus[k] += eps
        minus[k] -= eps
        fd = (loss(plus) - loss(minus)) / (2 * eps)
        err = abs(derivs[k] - fd) / max(1.0, abs(fd))
        assert err < 1e-5, \
            f"Active argument {k}{form}: reverse {derivs[k]} vs finite differences {fd}"
        worst = max(worst, err)
    return worst


def tangent_adjoint_products(cfg, A, B, trips, seed):
    """``(<J v, w>, <v, J^T w>)`` for a kernel ``k(C, A, B, trips)`` whose output ``C`` starts
    at zero, with random directions ``v`` (forward mode) and seeds ``w`` (reverse mode): the
    dot-product test checks the tangent and the adjoint against each other."""
    n = np.size(A)
    g = np.random.default_rng(seed)
    vA, vB, w = g.standard_normal(n), g.standard_normal(n), g.standard_normal(n)
    Jv = np.zeros(n)
    tg.autodiff(tg.Forward, cfg, tg.Const, tg.Duplicated(np.zeros(n), Jv),
                tg.Duplicated(A.copy(), vA.copy()), tg.Duplicated(B.copy(), vB.copy()), trips,
                ndrange=n)
    gA, gB = np.zeros(n), np.zeros(n)
    tg.autodiff(tg.Reverse, cfg, tg.Const, tg.Duplicated(np.zeros(n), w.copy()),
                tg.Duplicated(A.copy(), gA), tg.Duplicated(B.copy(), gB), trips, ndrange=n)
    return float(Jv @ w), float(vA @ gA + vB @ gB)
