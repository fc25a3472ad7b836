"""Under verify, arrays host code makes from recorded values during a recording
(tapegrad/tape/provenance.py): ``u = 0.9 * u`` between launches is refused at gradient()
with both lines named, when other sources keep the target connected; recorded operations
and true constants are not refused, and their gradients match central differences."""

import tracemalloc

import numpy as np
import pytest

import tapegrad as tg

CPU = tg.CPU()
u0 = np.linspace(0.1, 1.0, 8)


@tg.kernel
def step(out, u, D):
    i = tg.index()
    out[i] = u[i] + D * u[i] * u[i]


@tg.kernel
def add_step(out, u, c, D):
    i = tg.index()
    out[i] += c[i] * u[i] + D * u[i] * u[i]


def run(u0, D, numpy_scale=False, steps=3):
    u = u0
    for k in range(steps):
        nu = np.zeros_like(u)
        step(CPU)(nu, u, D, ndrange=u.size)
        if k == 0:
            u = 0.9 * nu if numpy_scale else tg.scale(nu, 0.9)
        else:
            u = nu
    return tg.sum(u)


def loss_value(u0, D):
    u = u0
    for k in range(3):
        u = u + D * u * u
        u = 0.9 * u if k == 0 else u
    return u.sum()


def gradients(verify, numpy_scale):
    with tg.Tape(verify=verify) as tape:
        D = tape.watch(0.3)
        s = run(u0, D, numpy_scale)
    return tape.gradient(s, [u0, D])


def central(f, x, h=1e-6):
    g = np.zeros_like(x)
    for j in range(x.size):
        e = np.zeros_like(x)
        e[j] = h
        g[j] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def test_a_source_replaced_by_numpy_between_launches_is_refused_under_verify():
    with pytest.raises(tg.TapegradError) as err:
        gradients(verify=True, numpy_scale=True)
    text = str(err.value)
    assert "recorded operation 2" in text and "recorded operation 1" in text
    assert "test_provenance.py:" in text and "tg.scale(u, 0.9)" in text


def test_the_recorded_way_is_not_refused_and_matches_central_differences():
    gu, gD = gradients(verify=True, numpy_scale=False)
    np.testing.assert_allclose(gu, central(lambda x: loss_value(x, 0.3), u0), rtol=1e-7)
    fD = central(lambda d: loss_value(u0, d[0]), np.array([0.3]))[0]
    assert gD == pytest.approx(fD, rel=1e-7)


def test_constants_made_inside_the_recording_are_not_refused():
    def loss(u0, D):
        c = np.full(u0.size, 0.5)            # a true constant, made while recording
        out = np.zeros_like(u0)              # added into by the kernel
        add_step(CPU)(out, u0, c, D, ndrange=u0.size)
        return tg.sum(out)

    with tg.Tape(verify=True) as tape:
        D = tape.watch(0.3)
        s = loss(u0, D)
    gu, gD = tape.gradient(s, [u0, D])
    np.testing.assert_allclose(gu, 0.5 + 2 * 0.3 * u0, rtol=1e-12)
    assert gD == pytest.approx(float(np.sum(u0 * u0)), rel=1e-12)


def test_the_disconnected_error_names_where_the_made_array_was_read():
    with tg.Tape(verify=True) as tape:
        s = run(u0, 0.3, numpy_scale=True, steps=1)
    with pytest.raises(tg.TapegradError, match=r"first read at test_provenance.py:\d+"):
        tape.gradient(s, [u0])


def test_tracing_is_left_as_it_was():
    was = tracemalloc.is_tracing()
    gradients(verify=True, numpy_scale=False)
    assert tracemalloc.is_tracing() == was
    tracemalloc.start()
    try:
        gradients(verify=True, numpy_scale=False)     # the user's tracing: nothing noted
        assert tracemalloc.is_tracing()
    finally:
        tracemalloc.stop()
