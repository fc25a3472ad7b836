"""CUDA C++ to a GPU binary with NVRTC (``cuda.bindings``; no GPU needed), cached on disk.

A binary is a cubin for the GPU's own architecture where this NVRTC knows it, else PTX for the
newest architecture it knows, which the driver then compiles.  Binaries are kept in tapegrad's
checked cache folder (:mod:`tapegrad.backends.cachedir`), named by a hash of the source, the
options and NVRTC's version; each file starts with the SHA-256 of what follows it, so that a
damaged file is compiled again rather than loaded.

>>> binary = compile_cuda('extern "C" __global__ void k(double *x) { x[0] = 1.0; }', "k", 90)
>>> binary.kind, binary.data[:4] == b"\\x7fELF"
('cubin', True)
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from tapegrad.backends import cachedir
from tapegrad.errors import BackendError, KernelCompileError

# no contraction of a * b + c into one fma: results are rounded per operation, as on the CPU
OPTIONS = ("--fmad=false", "--std=c++17")
_INSTALL = ("NVRTC from PyPI: pip install 'tapegrad[cuda13]' (or 'tapegrad[cuda12]' for a "
            "CUDA 12 driver)")


@dataclass(frozen=True)
class Binary:
    kind: str         # "cubin" (machine code) or "ptx" (compiled by the driver when loaded)
    arch: int         # the compute capability it targets, as 90 for sm_90
    data: bytes


class _CudaBindings:
    """NVRTC through NVIDIA's ``cuda.bindings`` (the extras install it)."""

    def __init__(self) -> None:
        from cuda.bindings import nvrtc
        nvrtc.nvrtcVersion()
        self.nvrtc = nvrtc

    def version(self) -> tuple[int, int]:
        _, major, minor = self.nvrtc.nvrtcVersion()
        return major, minor

    def archs(self) -> tuple[int, ...]:
        return tuple(self.nvrtc.nvrtcGetSupportedArchs()[1])

    def compile(self, source: str, name: str, options: list[str], cubin: bool
                ) -> tuple[bytes | None, str]:
        """(the binary or None, NVRTC's log)"""
        nv = self.nvrtc
        _, program = nv.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
        try:
            (err,) = nv.nvrtcCompileProgram(program, len(options), [o.encode() for o in options])
            # (buffers the bindings write into: bytearrays, never bytes, which CPython may
            # share: b" " * 1 is the interpreter's own b" ")
            _, size = nv.nvrtcGetProgramLogSize(program)
            log = bytearray(size)
            nv.nvrtcGetProgramLog(program, log)
            text = bytes(log).rstrip(b"\0").decode(errors="replace")
            if err != nv.nvrtcResult.NVRTC_SUCCESS:
                return None, text
            get_size, get = ((nv.nvrtcGetCUBINSize, nv.nvrtcGetCUBIN) if cubin
                             else (nv.nvrtcGetPTXSize, nv.nvrtcGetPTX))
            _, size = get_size(program)
            data = bytearray(size)
            get(program, data)
            return bytes(data), text
        finally:
            nv.nvrtcDestroyProgram(program)


class _CuPys:
    """NVRTC through CuPy's own bindings (a GPU machine with CuPy but not ``cuda.bindings``)."""

    def __init__(self) -> None:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
        self.nvrtc = nvrtc

    def version(self) -> tuple[int, int]:
        return tuple(self.nvrtc.getVersion())

    def archs(self) -> tuple[int, ...]:
        return tuple(self.nvrtc.getSupportedArchs())

    def compile(self, source: str, name: str, options: list[str], cubin: bool
                ) -> tuple[bytes | None, str]:
        nv = self.nvrtc
        program = nv.createProgram(source, f"{name}.cu", (), ())
        try:
            try:
                nv.compileProgram(program, options)
            except nv.NVRTCError:
                return None, nv.getProgramLog(program)
            # (CuPy strips the terminating NUL, which the driver needs to load PTX)
            data = nv.getCUBIN(program) if cubin else nv.getPTX(program) + b"\0"
            return data, nv.getProgramLog(program)
        finally:
            nv.destroyProgram(program)


@functools.cache
def _nvrtc() -> Any:
    for kind in (_CudaBindings, _CuPys):
        try:
            return kind()
        except (ImportError, RuntimeError, OSError):
            continue
    raise BackendError(f"tg.CUDA() compiles kernels with NVRTC, which was not found: install "
                       f"{_INSTALL}") from None


@functools.cache
def version() -> tuple[int, int]:
    return _nvrtc().version()


@functools.cache
def supported_archs() -> tuple[int, ...]:
    return _nvrtc().archs()


def target(arch: int) -> tuple[str, int]:
    """What to compile for a GPU of compute capability ``arch``: its cubin, or PTX for the
    newest architecture NVRTC knows below it (a GPU newer than this NVRTC)."""
    known = supported_archs()
    if arch in known:
        return "cubin", arch
    older = [a for a in known if a < arch]
    if not older:
        raise BackendError(f"this NVRTC ({'.'.join(map(str, version()))}) compiles for "
                           f"sm_{min(known)} and newer, not for this GPU's sm_{arch}: install "
                           f"an NVRTC that matches your driver ({_INSTALL})")
    return "ptx", max(older)


def compile_cuda(source: str, name: str, arch: int) -> Binary:
    """The binary of ``source`` for compute capability ``arch``: from the cache, or compiled
    now (``name`` names the program in NVRTC's messages and the cached file)."""
    kind, arch = target(arch)
    digest = hashlib.sha256("\0".join((source, kind, str(arch), *OPTIONS,
                                       repr(version()))).encode()).hexdigest()[:24]
    filename = f"cuda_{name}_{digest}.{kind}"
    for folder in dict.fromkeys((cachedir.cache_dir(), cachedir.write_dir())):
        data = _read(folder / filename)
        if data is not None:
            return Binary(kind, arch, data)
    binary = Binary(kind, arch, _compile(source, name, kind, arch))
    _write(cachedir.write_dir() / filename, binary.data)
    return binary


def _compile(source: str, name: str, kind: str, arch: int) -> bytes:
    gpu = f"sm_{arch}" if kind == "cubin" else f"compute_{arch}"
    data, log = _nvrtc().compile(source, name, [f"--gpu-architecture={gpu}", *OPTIONS],
                                 cubin=kind == "cubin")
    if data is None:
        raise KernelCompileError(
            f"{name}: NVRTC refused the generated CUDA C++ for {gpu}:\n{log.strip()}\nThis is "
            f"tapegrad's bug: please report it with kern.source(backend=tg.CUDA()).")
    return data


def _read(path: Any) -> bytes | None:
    """A cached binary's bytes, if the file is trusted and whole; a damaged one is removed."""
    raw = cachedir.read_checked(
        path, lambda raw: hashlib.sha256(raw[64:]).hexdigest().encode() == raw[:64],
        "does not hold what its checksum says (damaged)", "compiling it again")
    return None if raw is None else raw[64:]


def _write(path: Any, data: bytes) -> None:
    cachedir.write_atomic(path, hashlib.sha256(data).hexdigest().encode() + data)
