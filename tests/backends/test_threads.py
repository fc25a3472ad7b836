"""The CPU backend's thread count (tapegrad/backends/cpu/threads.py): Numba's count or the
user's setting, never above the cores an affinity mask or a cgroup quota grants; the notice
of a long compile.  Timings are the bench's business (python -m tapegrad bench)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

import tapegrad as tg
from tapegrad.backends.cpu import threads
from tapegrad.backends.notice import compiling


@pytest.fixture
def counter():
    tc = threads.ThreadCount()
    tc.enabled, tc.cores = True, 4
    before = numba.get_num_threads()
    yield tc
    numba.set_num_threads(before)


def test_never_more_threads_than_usable_cores(counter):
    counter.cores = 2                      # (Numba may have started one thread per core)
    assert counter.get(8) == 2
    assert counter.get(1) == 1
    counter.enabled = False                # TAPEGRAD_CAP_THREADS=0
    assert counter.get(8) == 8
    assert 1 <= threads.usable_cores() <= (threads.os.cpu_count() or 1)


class FakeNumba:
    """Numba's per-thread count, as ``for_launch`` sees it (any count, on any machine)."""

    def __init__(self, n: int):
        self.n = n

    def get_num_threads(self) -> int:
        return self.n

    def set_num_threads(self, n: int) -> None:
        self.n = n


def test_for_launch_caps_numbas_count_and_follows_the_users_setting(counter, monkeypatch):
    fake = FakeNumba(8)                    # Numba's count: one thread per core of the machine
    monkeypatch.setattr(threads, "numba", fake)
    ceiling = fake.get_num_threads()
    counter.cores = 1
    assert counter.for_launch(fake.get_num_threads()) == 1
    assert fake.get_num_threads() == 1
    counter.cores = 4
    assert counter.for_launch(fake.get_num_threads()) == min(ceiling, 4)
    fake.set_num_threads(1)                # the user asks for one thread: that is the ceiling
    assert counter.for_launch(1) == 1


def test_kernels_stay_right_on_one_thread(counter):

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


def test_a_second_compile_under_one_name_says_it_is_another_variant(capsys):
    import time
    for _ in range(2):
        with compiling("twice_compiled_adjoint", after_s=0.01):
            time.sleep(0.1)
    first, second = capsys.readouterr().err.strip().splitlines()
    assert first.endswith("compiling twice_compiled_adjoint (first use; cached afterwards)")
    assert "compiling another variant of twice_compiled_adjoint (other argument types" in second


@pytest.mark.parametrize("variable", ["PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
def test_under_an_mpi_launcher_only_rank_0_says_it_compiles(capsys, monkeypatch, variable):
    import time
    for rank, says in ((1, False), (0, True), (3, False)):
        monkeypatch.setenv(variable, str(rank))
        with compiling("ranked_kernel", after_s=0.01):
            time.sleep(0.1)
        assert ("ranked_kernel" in capsys.readouterr().err) == says, rank


def test_a_cgroup_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(threads, "_own_cgroup", lambda: "")
    (tmp_path / "cpu.max").write_text("150000 100000\n")        # cgroup v2: 1.5 cores
    assert threads.cgroup_quota(str(tmp_path)) == 2
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_quota(str(tmp_path)) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")    # cgroup v1: 3 cores
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert threads.cgroup_quota(str(v1)) == 3
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_quota(str(v1)) is None


