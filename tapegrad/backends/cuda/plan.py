"""A compiled CUDA kernel's launch, written out once for its argument types: the arguments
packed by one ``struct.pack_into`` into a buffer made once, whose slots' addresses are the
``kernelParams`` of one ``cuLaunchKernel`` (CuPy's ``cupy.cuda.driver.launchKernel``).

A launch costs tapegrad only what its kernel needs: no per-argument dispatch, no objects made
per argument (CuPy's ``Function.__call__`` makes one per argument), the grid computed inline.
``source`` shows what runs, e.g. for ``saxpy(Z, a, X, Y)`` on float32 arrays::

    def launch(args, nd):
        a0, a1, a2, a3 = args
        p0 = a0.data.ptr if type(a0) is CUPY and a0._c_contiguous else ADDRESS('Z', a0)
        ...

Each argument has an 8-byte slot (a float32 or int32 in its first 4 bytes): the driver reads
as many bytes from each slot as the kernel's parameter has.  One lock per kernel keeps two
threads from packing into one buffer at once.  ``chain`` launches it along a chain of states
(a tape's sweep), ``stage`` packs a CUDA graph's node (``graphs.py``) without launching.
"""

from __future__ import annotations

import ctypes
import linecache
import struct
import threading
from typing import Any

import numpy as np

from tapegrad.backends.c.items import disjoint
from tapegrad.frontend.types import Array

# a scalar parameter's struct code, padded to its 8-byte slot
_SCALAR_CODES = {"float64": "d", "float32": "f4x", "int64": "q", "int32": "i4x", "bool": "i4x"}
_PAIRWISE = 6        # up to this many arrays, the overlap test is written out pair by pair


class LaunchCode:
    """The launch function of one compiled kernel (``launch(args, nd)``), its source, and
    the buffer its arguments are packed into."""

    def __init__(self, launcher: Any, params: list[str], argtypes: tuple, rank: int):
        slots, self.fmt = [], "<"
        lines = ["def launch(args, nd):",
                 f"    {', '.join(f'a{k}' for k in range(len(params)))}, = args"]
        emit = lines.append
        arrays = []
        self.offsets: list[int | None] = [None] * len(params)   # (an array address slot)
        for k, (name, t) in enumerate(zip(params, argtypes)):
            if isinstance(t, Array):
                arrays.append(k)
                self.offsets[k] = 8 * len(slots)
                emit(f"    p{k} = a{k}.data.ptr if type(a{k}) is CUPY and a{k}._c_contiguous "
                     f"else ADDRESS({name!r}, a{k})")
                emit(f"    s{k} = a{k}.shape")
                if launcher.restricts:
                    emit(f"    b{k} = a{k}.nbytes if type(a{k}) is CUPY else NBYTES(a{k})")
                slots.append(f"p{k}")
                slots += [f"s{k}[{d}]" for d in range(t.ndim)]
                self.fmt += "Q" + "q" * t.ndim
            else:       # (NumPy's bool is no int to struct: a C int 0 or 1)
                slots.append(f"(1 if a{k} else 0)" if t.dtype == "bool" else f"a{k}")
                self.fmt += _SCALAR_CODES[t.dtype]
        extents = [f"n{d}" for d in range(rank)]
        emit(f"    {', '.join(extents)}, = nd")
        slots += extents
        self.fmt += "q" * rank
        self.size = struct.calcsize(self.fmt)
        grid = _grid_lines(rank, launcher)
        lines += grid
        if launcher.restricts:
            emit(f"    if {_disjoint_test(arrays)}:")
            emit("        variant = RESTRICT")
            emit("    else:")
            emit("        variant = L.variants.get(False) or L.variant(False)")
        else:
            emit("    variant = PLAIN")
        emit("    L.last = variant")
        head = list(lines)
        emit("    with LOCK:")
        emit("        try:")
        emit(f"            PACK(FMT, BUFFER, 0, {', '.join(slots)})")
        emit("        except (struct.error, OverflowError):   # (a float32 past its range: inf)")
        emit("            PACK_EXACT(args, nd)")
        emit("        if GET_DEVICE() == DEVICE:")
        emit("            LAUNCH(variant.function.ptr, gx, gy, gz, BX, BY, BZ, variant.shared, "
             "STREAM().ptr, PARAMS, 0)")
        emit("        else:")
        emit("            with ON_DEVICE(DEVICE):")
        emit("                LAUNCH(variant.function.ptr, gx, gy, gz, BX, BY, BZ, "
             "variant.shared, STREAM().ptr, PARAMS, 0)")
        # a chain (backends/launch_chain.py): packed once, then only the two swapped arrays'
        # addresses rewritten between launches, and those of the states each launch reads
        # (other arrays of one shape and type; they share no memory with the shadows, which
        # the sweep made: the same variant and grid)
        pointers = ", ".join(f"p{k}" if k in arrays else "None" for k in range(len(params)))
        lines += ["", "", "def chain(steps, args, nd, xs, ys, states=(), per_launch=None):"]
        lines += head[1:] + [
            f"    pointers = ({pointers},)",
            "    px, py, ox, oy = pointers[xs], pointers[ys], OFFSET[xs], OFFSET[ys]",
            "    at = [OFFSET[k] for k in states]",
            "    with LOCK, ON_DEVICE(DEVICE):",
            "        try:",
            f"            PACK(FMT, BUFFER, 0, {', '.join(slots)})",
            "        except (struct.error, OverflowError):",
            "            PACK_EXACT(args, nd)",
            "        f, shared, stream = variant.function.ptr, variant.shared, STREAM().ptr",
            "        for s in range(steps):",
            "            if s % 2:",
            "                PACK('<Q', BUFFER, ox, py)",
            "                PACK('<Q', BUFFER, oy, px)",
            "            elif s:",
            "                PACK('<Q', BUFFER, ox, px)",
            "                PACK('<Q', BUFFER, oy, py)",
            "            if per_launch is not None:",
            "                for o, a in zip(at, per_launch[s]):",
            "                    PACK('<Q', BUFFER, o, a.data.ptr if type(a) is CUPY and "
            "a._c_contiguous else ADDRESS('state', a))",
            "            LAUNCH(f, gx, gy, gz, BX, BY, BZ, shared, stream, PARAMS, 0)"]
        # a node of a CUDA graph (graphs.py): packed into the node's own buffer, not launched
        lines += ["", "", "def stage(args, nd, buffer):"] + head[1:] + [
            "    try:",
            f"        PACK(FMT, buffer, 0, {', '.join(slots)})",
            "    except (struct.error, OverflowError):",
            "        PACK_EXACT(args, nd, buffer)",
            "    return variant, gx, gy, gz"]
        self.source = "\n".join(lines) + "\n"
        self.slots = len(slots)
        self.buffer = ctypes.create_string_buffer(max(self.size, 8))
        base = ctypes.addressof(self.buffer)           # (every slot 8 bytes: FMT pads)
        self.params = (ctypes.c_void_p * max(len(slots), 1))(
            *(base + 8 * n for n in range(len(slots))))
        self.launch, self.chain, self.stage = self._compile(launcher, arrays)

    def _compile(self, launcher: Any, arrays: list[int]) -> Any:
        cupy, device = launcher.cupy, launcher.device
        block = (tuple(launcher.block) + (1, 1))[:3]
        pack = struct.pack_into

        def pack_exact(args: tuple, nd: tuple, buffer: Any = self.buffer) -> None:
            """The arguments as NumPy converts them, each in its 8-byte slot (an array its
            address, which ``launcher.pack`` gives as the CuPy array itself)."""
            data = b"".join(_slot(v) for v in launcher.pack(args, nd))
            ctypes.memmove(buffer, data, min(len(data), ctypes.sizeof(buffer)))

        scope = dict(
            CUPY=getattr(cupy, "ndarray", None), ADDRESS=launcher.address,
            L=launcher, LOCK=threading.Lock(), PACK=pack, PACK_EXACT=pack_exact, FMT=self.fmt,
            BUFFER=self.buffer, PARAMS=ctypes.addressof(self.params), struct=struct,
            GET_DEVICE=cupy.cuda.runtime.getDevice, DEVICE=device,
            ON_DEVICE=cupy.cuda.Device, LAUNCH=cupy.cuda.driver.launchKernel,
            STREAM=cupy.cuda.get_current_stream, BX=block[0], BY=block[1], BZ=block[2],
            SHAPE=launcher.shape, DISJOINT=disjoint, NBYTES=launcher.nbytes,
            OFFSET=self.offsets,
            RESTRICT=launcher.variants.get(True), PLAIN=launcher.variants.get(False))
        filename = f"<tapegrad CUDA launch of {launcher.name}>"
        linecache.cache[filename] = (len(self.source), None, self.source.splitlines(True),
                                     filename)
        exec(compile(self.source, filename, "exec"), scope)
        return scope["launch"], scope["chain"], scope["stage"]


def _slot(v: Any) -> bytes:
    """One packed value as its 8-byte slot."""
    if hasattr(v, "data") and hasattr(v.data, "ptr"):       # (a CuPy array: its address)
        return struct.pack("<Q", v.data.ptr)
    if isinstance(v, np.generic):
        return v.tobytes().ljust(8, b"\0")
    return struct.pack("<Q", int(v))


def _grid_lines(rank: int, launcher: Any) -> list[str]:
    """Blocks along x, y, z (the ndrange's last dimension along x; a block takes ``items``
    workgroups of dimension 0); past the GPU's limits, ``launch_shape``'s error."""
    g, items, most = launcher.groupsize, launcher.items, launcher.limits.max_grid
    per_block = [g[0] * items] + list(g[1:])
    blocks = [f"-(-n{d} // {per_block[d]})" for d in range(rank)]
    axes = list(reversed(blocks)) + ["1"] * (3 - rank)
    lines = [f"    gx, gy, gz = {axes[0]}, {axes[1]}, {axes[2]}",
             f"    if gx > {most[0]} or gy > {most[1]} or gz > {most[2]}:",
             "        SHAPE(nd)",
             "    if not (gx and gy and gz):",
             "        return"]
    return lines


def _disjoint_test(arrays: list[int]) -> str:
    """An expression true where no two of the arrays share a byte."""
    if len(arrays) > _PAIRWISE:
        spans = ", ".join(f"(0, p{k}, p{k} + b{k})" for k in arrays)
        return f"DISJOINT(({spans},))"
    pairs = [f"(p{j} + b{j} <= p{k} or p{k} + b{k} <= p{j})"
             for n, j in enumerate(arrays) for k in arrays[n + 1:]]
    return " and ".join(pairs) or "True"

