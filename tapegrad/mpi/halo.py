"""Ghost cells of a Cartesian domain decomposition, exchanged between processes and recorded
on the tape with their adjoint.

Each process owns a block of the global grid (an uneven split gives the first processes of a
dimension one cell more) and holds it with ``width`` ghost cells on every side.  The exchange
fills the ghosts from the neighbours' edge cells, one dimension after the other, each slab
spanning the ghosts of the other dimensions (so edges and corners arrive too).  Its adjoint
runs the same steps transposed, last dimension first: each ghost cell's adjoint goes back to
the process that owns the cell and is added into that cell's adjoint there; the ghosts'
adjoints are then zero (their old values fed nothing).  Ghosts on a non-periodic edge of the
global grid are not written, and their adjoints pass through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tapegrad.backends.registry import array_kind
from tapegrad.errors import TapegradError
from tapegrad.mpi.buffers import (
    check_array,
    checked_sendrecv,
    incoming,
    mpi,
    on_device_of,
    outgoing,
)
from tapegrad.mpi.node import share_cores
from tapegrad.tape.modes import current_forward, recording_tapes, refuse_jacobian
from tapegrad.tape.records import Record

_TO_HIGH, _TO_LOW = 101, 102      # message tags: slabs going up, and down, a dimension
_SAME = ("every process of the decomposition must exchange arrays of one dtype (cast them "
         "alike: u.astype(np.float64) on each)")


class Halo:
    """The decomposition of a grid of ``global_shape`` over the processes of ``comm`` (a
    communicator made with ``comm.Create_cart``, whose topology is used; or any other, which
    gets a balanced one), with ``width`` ghost cells on every side; ``periodic``: one flag,
    or one per dimension.

    >>> import numpy as np, tapegrad.mpi as tgm
    >>> from mpi4py import MPI
    >>> halo = tgm.Halo(MPI.COMM_WORLD, (6, 4), width=1, periodic=True)
    >>> u = halo.local(np.arange(24.0).reshape(6, 4))   # this process's block and its ghosts
    >>> halo.exchange(u)                                # (recorded on a tape, if one records)
    >>> u.shape, u[0, 1:-1].tolist()                    # (one process: the periodic images)
    ((8, 6), [20.0, 21.0, 22.0, 23.0])
    """

    def __init__(self, comm: Any, global_shape: tuple[int, ...], width: int = 1,
                 periodic: bool | tuple[bool, ...] = False):
        MPI = mpi()
        ndim = len(global_shape)
        flags = (periodic,) * ndim if isinstance(periodic, bool) else tuple(periodic)
        if len(flags) != ndim:
            raise TapegradError(f"Halo: {len(flags)} periodic flag(s) for a {ndim}-D grid; give "
                                "one, or one per dimension")
        if isinstance(comm, MPI.Cartcomm):
            dims, periods, _ = comm.Get_topo()
            if len(dims) != ndim:
                raise TapegradError(f"Halo: a {ndim}-D grid on a {len(dims)}-D Cartesian "
                                    "communicator; make it with as many dimensions as the grid")
            if not isinstance(periodic, bool) or periodic:
                if tuple(bool(p) for p in periods) != flags:
                    raise TapegradError("Halo: periodic= differs from the Cartesian "
                                        f"communicator's periods {tuple(periods)}; give one")
            self.cart, flags = comm, tuple(bool(p) for p in periods)
        else:
            dims = MPI.Compute_dims(comm.Get_size(), ndim)
            self.cart = comm.Create_cart(dims, periods=list(flags), reorder=False)
        share_cores(self.cart, MPI)
        if width < 1:
            raise TapegradError(f"Halo: width is the number of ghost cells per side (>= 1), "
                                f"got {width}")
        self.global_shape, self.width, self.periodic = tuple(global_shape), width, flags
        self.dims = tuple(dims)
        coords = self.cart.Get_coords(self.cart.Get_rank())
        self.interior = tuple(_share(n, p, c) for n, p, c in zip(global_shape, dims, coords))
        self.offset = tuple(_start(n, p, c) for n, p, c in zip(global_shape, dims, coords))
        # (the smallest share, the same on every process: all of them refuse alike)
        small = [(d, n // p) for d, (n, p) in enumerate(zip(global_shape, dims)) if n // p < width]
        if small:
            d, n = small[0]
            raise TapegradError(
                f"Halo: a process holds {n} cell(s) of dimension {d} ({global_shape[d]} over "
                f"{dims[d]} processes), fewer than the ghost width {width}: ghosts would come "
                "from beyond the neighbour. Use fewer processes along it, or a larger grid")
        self.shape = tuple(n + 2 * width for n in self.interior)
        self.neighbours = [self.cart.Shift(d, 1) for d in range(ndim)]    # (low, high)

    # -- the exchange ---------------------------------------------------------------------

    def exchange(self, u: Any) -> None:
        """Fill ``u``'s ghost cells from the neighbouring processes (in place); recorded on
        the tapes that record, with its adjoint, and carried in forward mode (the tangents'
        ghosts are exchanged too).  Every process of the communicator must call it."""
        refuse_jacobian("halo.exchange", self.cart)
        check_array(u, "halo.exchange")
        if tuple(u.shape) != self.shape:
            raise TapegradError(f"halo.exchange: an array of shape {tuple(u.shape)}, but this "
                                f"process's block with its ghosts has shape {self.shape} "
                                "(halo.zeros() makes one)")
        ctx = current_forward()
        # (forward mode: u's tangents are exchanged too, zeros where u has none here: its
        # ghosts' tangents are the neighbours', and every process makes the same calls
        # whatever its own tangents: docs/mpi.md, "Guards")
        if ctx is not None and ctx.taped:   # tg.hvp: the values' and tangents', recorded
            tangent = ctx.tangents_or_zero(u)
            with ctx.on_tape():
                self.exchange(u)
                self.exchange(tangent[0])
            ctx.wrote(u)
            return
        tapes = recording_tapes()
        idents = [tape.before_host_write(u, "halo.exchange") for tape in tapes]
        self.fill_ghosts(u)
        if ctx is not None:
            for t in ctx.tangents_or_zero(u):
                self.fill_ghosts(t)
            ctx.wrote(u)
        for tape, ident in zip(tapes, idents):
            tape.after_host_write(u, ident)
            tape.record_host(HaloRecord(reads=[ident], writes=[ident], name="halo.exchange",
                                        halo=self), [], read=(u,))

    def fill_ghosts(self, u: Any) -> None:
        """The exchange itself, not recorded.  A message of the wrong size (another dtype
        on a neighbour) is an error after every swap has run: the neighbours' later swaps
        wait for this process's messages."""
        errors = []
        for d, (low, high) in enumerate(self.neighbours):
            for swap in ((self._slab(d, "top"), high, self._slab(d, "ghost low"), low,
                          _TO_HIGH),
                         (self._slab(d, "bottom"), low, self._slab(d, "ghost high"), high,
                          _TO_LOW)):
                try:
                    self._swap(u, *swap)
                except TapegradError as e:
                    errors.append(e)
        if errors:
            raise errors[0]

    def add_ghosts_back(self, bar: Any) -> None:
        """The exchange's adjoint on the shadow ``bar``: ghost adjoints to their owners,
        added in there, ghosts' adjoints zeroed."""
        for d in reversed(range(len(self.neighbours))):
            low, high = self.neighbours[d]
            got_low = self._swap_back(bar, self._slab(d, "ghost low"), low,
                                      self._slab(d, "top"), high, _TO_HIGH)
            got_high = self._swap_back(bar, self._slab(d, "ghost high"), high,
                                       self._slab(d, "bottom"), low, _TO_LOW)
            if got_low:
                bar[self._slab(d, "ghost low")] = 0
            if got_high:
                bar[self._slab(d, "ghost high")] = 0

    def _swap(self, u: Any, send: tuple, dest: int, recv: tuple, source: int, tag: int) -> None:
        """``u[send]`` to ``dest``; from ``source`` into ``u[recv]``."""
        MPI = mpi()
        buffer = incoming(u, u[recv].shape, u.dtype)
        checked_sendrecv(self.cart, outgoing(u[send]), dest, buffer, source, tag,
                         "halo.exchange", _SAME)
        if source != MPI.PROC_NULL:
            u[recv] = on_device_of(u, buffer)

    def _swap_back(self, bar: Any, ghosts: tuple, owner: int, cells: tuple, source: int,
                   tag: int) -> bool:
        """The transpose of ``_swap``: ``bar[ghosts]`` back to their ``owner``; what comes
        from ``source`` (the adjoints of our ``cells`` that it held as ghosts) added into
        ``bar[cells]``.  Returns whether these ghosts were written by the exchange."""
        MPI = mpi()
        buffer = incoming(bar, bar[cells].shape, bar.dtype)
        checked_sendrecv(self.cart, outgoing(bar[ghosts]), owner, buffer, source, tag,
                         "halo.exchange's adjoint", _SAME)
        if source != MPI.PROC_NULL:
            bar[cells] += on_device_of(bar, buffer)
        return owner != MPI.PROC_NULL

    def _slab(self, d: int, which: str) -> tuple:
        """The index of a slab across dimension ``d``, over the whole extent (ghosts too) of
        the others: this process's first or last ``width`` cells ("bottom", "top"), or the
        ghosts below or above them."""
        w, n = self.width, self.interior[d]
        span = {"ghost low": slice(0, w), "bottom": slice(w, 2 * w),
                "top": slice(n, n + w), "ghost high": slice(n + w, n + 2 * w)}[which]
        return tuple(span if k == d else slice(None) for k in range(len(self.shape)))

    # -- arrays of this decomposition -----------------------------------------------------

    def zeros(self, dtype: Any = np.float64, xp: Any = np) -> Any:
        """A block of this process with its ghosts, zeros (``xp``: numpy or cupy)."""
        return xp.zeros(self.shape, dtype)

    def owned(self, dtype: Any = np.float64, xp: Any = np) -> Any:
        """1 on the cells this process owns, 0 on its ghosts: ``tg.dot(u, halo.owned())`` is
        the differentiable sum of ``u`` over them (a view such as ``halo.inner(u)`` is a
        second array to a tape, which follows whole arrays)."""
        mask = xp.zeros(self.shape, dtype)
        mask[tuple(slice(self.width, self.width + n) for n in self.interior)] = 1
        return mask

    def inner(self, u: Any) -> Any:
        """The view of the cells this process owns (no ghosts)."""
        w = self.width
        return u[tuple(slice(w, w + n) for n in self.interior)]

    def local(self, global_array: Any) -> Any:
        """This process's block of a global array, ghosts included (taken across the
        periodic edges; zeros beyond the others): a new array."""
        g = np.asarray(global_array)
        if tuple(g.shape) != self.global_shape:
            raise TapegradError(f"halo.local: a global array of shape {tuple(g.shape)}, but "
                                f"the grid is {self.global_shape}")
        block = g
        for d, (start, n) in enumerate(zip(self.offset, self.interior)):
            idx = np.arange(start - self.width, start + n + self.width)
            inside = (idx >= 0) & (idx < g.shape[d])
            take = np.where(inside | self.periodic[d], idx % g.shape[d], 0)
            block = np.take(block, take, axis=d)
            if not self.periodic[d]:
                mask = inside.reshape([-1 if k == d else 1 for k in range(g.ndim)])
                block = np.where(mask, block, 0)
        return np.ascontiguousarray(block, dtype=g.dtype)

    def gather(self, u: Any) -> np.ndarray:
        """The global array from every process's owned cells, on every process (for checks
        and output; it moves the whole grid)."""
        mine = array_kind(u).to_numpy(self.inner(u))
        pieces = self.cart.allgather((self.offset, mine))
        out = np.empty(self.global_shape, dtype=mine.dtype)
        for offset, piece in pieces:
            out[tuple(slice(o, o + n) for o, n in zip(offset, piece.shape))] = piece
        return out

    def volume(self, itemsize: int = 8) -> int:
        """Bytes this process sends in one exchange (both directions of every dimension
        that has a neighbour)."""
        MPI = mpi()
        total = 0
        for d, (low, high) in enumerate(self.neighbours):
            slab = int(np.prod([self.width if k == d else n
                                for k, n in enumerate(self.shape)]))
            total += slab * itemsize * ((low != MPI.PROC_NULL) + (high != MPI.PROC_NULL))
        return total


@dataclass
class HaloRecord(Record):
    """A recorded ``halo.exchange``: its adjoint routes the ghosts' adjoints home."""

    halo: Any = None
    communicates = True

    @property
    def comms(self) -> tuple:
        return (self.halo.cart,)

    def redirect(self, pos: int, copy: Any) -> None:
        pass                           # (its adjoint reads no values)

    def backward(self, sweep: Any) -> None:
        self.halo.add_ghosts_back(sweep.shadow(self.reads[0]))


def _share(n: int, parts: int, k: int) -> int:
    """Cells of ``n`` held by part ``k`` of ``parts`` (the first ``n % parts`` get one more)."""
    return n // parts + (1 if k < n % parts else 0)


def _start(n: int, parts: int, k: int) -> int:
    return sum(_share(n, parts, j) for j in range(k))
