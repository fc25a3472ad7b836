"""The CPU backend's thread count on a busy machine (tapegrad/backends/cpu/threads.py): taken
down by the other runnable tasks, back up when they are gone, never above Numba's count or
the user's own setting.  Timings are the bench's business (python -m tapegrad bench)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu import threads
from tapegrad.backends.notice import compiling


@pytest.fixture
def counter(monkeypatch):
    tc = threads.ThreadCount()
    tc.enabled, tc.cores = True, 4
    others = {"n": 0}
    monkeypatch.setattr(threads, "other_runnable", lambda: others["n"])
    monkeypatch.setattr(threads, "REFRESH_S", 0.0)
    before = numba.get_num_threads()
    yield tc, others
    numba.set_num_threads(before)


def test_the_count_follows_the_other_runnable_tasks(counter):
    tc, others = counter
    most = numba.get_num_threads()
    assert tc.get(4) == 4
    others["n"] = 2
    assert tc.get(4) == 2
    others["n"] = 9
    assert tc.get(4) == 1
    others["n"] = 0
    assert tc.get(most) == most


def test_for_launch_sets_numbas_count_and_restores_it(counter):
    tc, others = counter
    ceiling = numba.get_num_threads()
    if ceiling < 2:
        pytest.skip("one thread: nothing to take down (Numba runs one thread here)")
    others["n"] = 9
    assert tc.for_launch(numba.get_num_threads()) == 1
    assert numba.get_num_threads() == 1
    others["n"] = 0
    assert tc.for_launch(numba.get_num_threads()) == ceiling
    assert numba.get_num_threads() == ceiling


def test_the_users_own_setting_is_the_ceiling(counter):
    tc, others = counter
    numba.set_num_threads(1)
    assert tc.for_launch(1) == 1         # idle, but the user asked for one thread


def test_other_runnable_reads_this_machine():
    assert threads.other_runnable() >= 0


def test_kernels_stay_right_on_one_thread(counter):
    tc, others = counter

    @tg.kernel
    def twice(B, A):
        i = tg.index()
        B[i] = 2.0 * A[i]

    A, B = np.arange(1000.0), np.zeros(1000)
    numba.set_num_threads(1)
    twice(tg.CPU())(B, A, ndrange=1000)
    np.testing.assert_array_equal(B, 2 * A)


def test_a_long_compile_says_so_and_a_short_one_does_not(capsys):
    import time
    with compiling("slow_kernel_adjoint", after_s=0.05):
        time.sleep(0.3)
    with compiling("quick_kernel", after_s=5.0):
        pass
    err = capsys.readouterr().err
    assert "compiling slow_kernel_adjoint (first use; cached afterwards)" in err
    assert "quick_kernel" not in err
