"""``tg.autodiff`` of one kernel launch: its annotations checked, its shadows kept apart, its
forward or reverse code run."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from tapegrad.api.autodiff_plans import ReverseRun, derivatives, remember, run_reverse
from tapegrad.backends.registry import kind_of
from tapegrad.errors import AdjointStackOverflow, LaunchError, TapegradError  # noqa: F401
from tapegrad.frontend import kernel_ir
from tapegrad.kernels import ConfiguredKernel
from tapegrad.runtime.adjoint import adjoint_of, overwritten_inputs
from tapegrad.runtime.arguments import (
    access,
    check_args,
    check_writable,
    masked_array,
    ndrange_of,
)
from tapegrad.runtime.launch import check_indices, one_parameter_per_array
from tapegrad.runtime.tangent import run_tangent
from tapegrad.tape.activity import (
    Active,
    Annotation,
    BatchDuplicated,
    Const,
    Duplicated,
    DuplicatedNoNeed,
    Mode,
    annotate,
)
from tapegrad.tape.arrays import is_array
from tapegrad.tape.forward import check_written_tangents_apart
from tapegrad.tape.identity import (
    array_key,
    byte_strides,
    disjoint,
    overlapping,
    sharing_pairs,
)
from tapegrad.tape.scalars import plain


def check_shadows_apart(f: Any, args: tuple, between_shadows: bool) -> None:
    """A shadow is memory of its own: one that is (or overlaps) its primal or another
    argument's array would have derivatives added into values the run reads (``Duplicated(A,
    A)`` turned ``A`` into ``A + cos(A)``), and two arguments' shadows sharing memory mix
    their derivatives (one array passed twice has one shadow: the same object is fine).
    Refused before anything runs."""
    pairs = [(k, a.val, d) for k, a in enumerate(args) if isinstance(a, Annotation)
             and a.kind in ("dup", "batch") and is_array(a.val)
             for d in (a.dval if isinstance(a.dval, tuple) else (a.dval,)) if is_array(d)]
    if not pairs:
        return
    values = [(k, plain(a.val if isinstance(a, Annotation) else a)) for k, a in enumerate(args)]
    arrays = [(k, x) for k, x in values if is_array(x)] + [(k, d) for k, _, d in pairs]
    if len({id(x) for _, x in arrays}) == len(arrays) and disjoint([x for _, x in arrays]):
        return
    name = getattr(f, "__name__", None) or getattr(getattr(f, "kernel", None), "name", "f")
    for n, (k, x, d) in enumerate(pairs):
        for j, y in values:
            if is_array(y) and overlapping(d, y):
                whose = "its own array" if j == k else f"argument {j}'s array"
                raise TapegradError(
                    f"{name}: the shadow given for argument {k} is {whose} or shares memory "
                    f"with it, so derivatives would be added into values the run reads; pass "
                    f"a separate array for the shadow (tg.make_zero(x))")
        for j, y, e in pairs[n + 1:] if between_shadows else ():
            if j == k or array_key(y) == array_key(x) or array_key(e) == array_key(d):
                continue      # (one array passed twice, or one shadow for two read arrays:
                # checked where the shadows meet, see one_object_per_memory)
            if overlapping(d, e):
                raise LaunchError(
                    f"{name}: the shadows given for arguments {k} and {j} share some of their "
                    "elements, so their derivatives would mix; give each array a shadow of "
                    "its own (tg.make_zero(x))")


def _check_arrays_apart(kernel: Any, values: tuple) -> None:
    """Two arguments that are different views of memory they share (``x`` and ``x[::-1]``,
    ``x[:4]`` and ``x[2:6]``) are refused before anything runs: derivatives follow each
    argument's array, so what flows through one view into the other would be lost (a tape
    refuses such programs too).  Views of the same elements in the same order are one array
    (``_one_object_per_array`` gave them one object); views sharing no element
    (``x[::2]``, ``x[1::2]``) are apart."""
    arrays = [(p, v) for p, v in zip(kernel_ir(kernel).params, values) if is_array(v)]
    if len(arrays) < 2:
        return
    by_name = dict(arrays)
    for p, q in sharing_pairs(arrays):
        if by_name[p] is not by_name[q]:
            raise LaunchError(
                f"{kernel.name}: arguments {p} and {q} are different views of memory they "
                f"share (shapes {tuple(by_name[p].shape)} and {tuple(by_name[q].shape)}, "
                f"strides {byte_strides(by_name[p])} and {byte_strides(by_name[q])}), so the "
                "derivatives that flow through one into the other would be lost; tg.autodiff "
                "takes one array per argument, or the same view for several (then they are "
                f"one array). Pass a copy ({q}.copy()) or the same view for both")


def _check_shadows_writable(kernel: Any, mode: str, shadows: list[tuple[str, Any, bool]],
                            what: str = "shadow") -> None:
    """A read-only shadow (``writeable=False``, ``np.broadcast_to``) where the derivatives
    are written is the user's error, said before anything runs (as a plain launch says of a
    read-only output); so is a masked array, whose mask a kernel would ignore.  ``shadows``:
    (its argument's name, or ``B[j]`` for a batch's j-th, the shadow, whether it is
    written)."""
    for p, d, written in shadows:
        if not isinstance(d, np.ndarray):
            continue
        name, of = f"d{p}", p.split("[")[0]
        if isinstance(d, np.ma.MaskedArray):
            raise LaunchError(f"{kernel.name}: argument {of}'s {what} {name} is a "
                              + masked_array(name))
        if written and not d.flags.writeable:
            hint = "; np.broadcast_to gives read-only views" if 0 in d.strides else ""
            raise LaunchError(
                f"{kernel.name}: argument {of}'s {what} {name} is read-only "
                f"({name}.flags.writeable is False{hint}) but {mode} writes it; pass a writable "
                f"array, e.g. {name}.copy()")


def _forward_kernel(mode: Mode, cfg: ConfiguredKernel, annotated: list[Annotation],
                    ndrange: Any, args: tuple) -> tuple:
    """Forward mode on a kernel: one launch computes its outputs and their tangents (``args``:
    as given, for its plan)."""
    kernel, backend = cfg.kernel, cfg.backend
    params = kernel_ir(kernel).params
    if len(annotated) != len(params):
        raise LaunchError(f"{kernel.name} takes {len(params)} argument(s) ({', '.join(params)}), "
                          f"got {len(annotated)}")
    width = batch_width(annotated)
    activity, tangents = [], {}
    for p, a in zip(params, annotated):
        kind, dirs = forward_annotation(kernel.name, p, a, width, backend)
        activity.append(kind)
        if dirs is not None:
            tangents[p] = dirs
    values = tuple(plain(a.val) for a in annotated)
    nd = ndrange_of(kernel, ndrange)
    check_args(kernel, backend, values)
    check = check_indices(cfg, values, nd)
    check_written_tangents_apart(kernel, params, values, tangents)
    check_writable(kernel, values)          # (the tangent's launch writes what the kernel does)
    _, written = access(kernel)
    _check_shadows_writable(kernel, "forward mode", [
        (p if len(dirs) == 1 else f"{p}[{j}]", d, p in written) for p, dirs in tangents.items()
        for j, d in enumerate(dirs)], "tangent")
    entry = run_tangent(cfg, values, tangents, tuple(activity), nd)
    remember(cfg, args, check, nd, tangent=entry)
    return (None,) if mode.with_primal else ()


def batch_width(annotated: list[Annotation]) -> int:
    widths = {len(a.dval) for a in annotated if isinstance(a, BatchDuplicated)}
    if len(widths) > 1:
        raise TapegradError(f"every BatchDuplicated needs the same number of tangents, got "
                            f"{sorted(widths)}")
    return widths.pop() if widths else 1


def forward_annotation(owner: str, p: Any, a: Annotation, width: int, backend: Any = None
                        ) -> tuple[str, tuple | None]:
    """(activity, tangents) of one argument in forward mode."""
    if isinstance(a, Active):
        raise TapegradError(f"{owner}: in forward mode a scalar's direction is given with "
                            f"tg.Duplicated(x, dx) (dx = 1.0 for the derivative in x); tg.Active "
                            "is for reverse mode")
    if isinstance(a, (Duplicated, BatchDuplicated)):
        dirs = tuple(a.dval) if isinstance(a, BatchDuplicated) else (a.dval,) * 1
        if isinstance(a, Duplicated) and width != 1:
            raise TapegradError(f"{owner}: mixing Duplicated with BatchDuplicated of width "
                                f"{width}; give every varying argument {width} tangents")
        if is_array(a.val):
            if not floats(a.val):     # (first: no tangent would do)
                raise no_derivative(owner, p, a.val, "tangent")
            for d in dirs:
                if not is_array(d) or d.shape != a.val.shape or d.dtype != a.val.dtype or \
                        (backend is not None and not backend.owns(d)):
                    raise LaunchError(f"{owner}: every tangent of {p} must match it (shape "
                                      f"{a.val.shape}, dtype {a.val.dtype}, same device); make "
                                      "one with tg.make_zero(x)")
                check_layout(owner, p, d, "tangent")
            return "dup", dirs
        if not isinstance(a.val, (float, np.floating)):
            raise TapegradError(f"{owner}: the tangent of {p} needs a float value, got "
                                f"{type(a.val).__name__}")
        return "active", tuple(float(d) for d in dirs)
    return "const", None


def host_array(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()


def autodiff_kernel(mode: Mode, cfg: ConfiguredKernel, ret: Any, args: tuple, ndrange: Any,
                     accumulate: bool = True) -> tuple:
    kernel, backend = cfg.kernel, cfg.backend
    if ret is not Const and not isinstance(ret, Const):
        raise TapegradError(
            f"a kernel returns nothing, so its return activity is tg.Const, not {ret!r}. To "
            "differentiate a scalar computed from its outputs, write a host function that "
            "launches the kernel and returns tg.sum(B) (then use tg.Active); to get a "
            "vector-Jacobian product, seed the output's shadow (dB[:] = w) and use tg.Const")
    annotated = _one_object_per_array(annotate(a) for a in args)
    # scalars from tg.sum/... as plain values for the adjoint; the primal launch takes them as
    # given, so that a tape or forward mode around this call records them (and their
    # derivatives) as it does any launch
    given = tuple(a.val for a in annotated)
    values = tuple(plain(v) for v in given)
    _check_arrays_apart(kernel, values)
    if len({id(v) for v in values}) < len(values):      # one array for several parameters?
        merged = _merged_autodiff(mode, cfg, ret, annotated, ndrange, accumulate)
        if merged is not None:
            return merged
    if not mode.reverse:
        return _forward_kernel(mode, cfg, annotated, ndrange, args)
    params = kernel_ir(kernel).params
    if len(annotated) != len(params):
        raise LaunchError(f"{kernel.name} takes {len(params)} argument(s) ({', '.join(params)}), "
                          f"got {len(annotated)}")
    activity = tuple(_check_annotation(kernel, backend, p, a) for p, a in zip(params, annotated))
    nd = ndrange_of(kernel, ndrange)
    check_args(kernel, backend, values)
    check = check_indices(cfg, values, nd)
    seeds: frozenset[str] = frozenset()
    if not accumulate:
        seeds = _seeds(kernel, params, annotated)
    primal = _primal_needed(kernel, params, annotated)
    if primal:
        check_writable(kernel, values)     # (the primal launch's own check, before anything)
    # every shadow is written (derivatives added, seeds consumed), but accumulate=False's
    # seeds, which are only read (and copied where the adjoint would write them)
    _check_shadows_writable(kernel, "reverse mode", [
        (p, a.dval, p not in seeds) for p, a in zip(params, annotated)
        if isinstance(a, Duplicated)])
    shadows = {p: a.dval for p, a in zip(params, annotated) if isinstance(a, Duplicated)}
    if accumulate:                        # (checked before anything runs)
        shadows = one_object_per_memory(kernel, shadows)
        _check_seeds_apart(kernel, shadows)
    else:
        _check_separate(kernel, shadows)
    # (the adjoint found once for all uses where it runs on these very arrays: copies of
    # overwritten inputs would be C-ordered, another signature; aliased shadows are separated
    # by run_adjoint before it looks the adjoint up)
    found = adjoint_of(cfg, values, activity, nd, seeds) \
        if len({id(d) for d in shadows.values()}) == len(shadows) else None
    overwritten: tuple[str, ...] = ()
    if primal:
        overwritten = tuple(overwritten_inputs(cfg, values, activity, nd,
                                               found if accumulate else None))
    how = ReverseRun(activity, primal, overwritten, seeds, None if overwritten else found)
    scalars = run_reverse(cfg, how, given, values, shadows, nd, accumulate)
    derivs = derivatives(tuple(a.val if isinstance(a, Active) else None for a in annotated),
                         params, scalars)
    remember(cfg, args, check, nd, how=how, accumulate=accumulate)
    return (derivs,) if not mode.with_primal else (derivs, None)


def elements_key(x: Any) -> tuple:
    """``array_key(x)`` with the strides of size-1 dimensions left out: views that are the
    same elements in the same order (``x[:, None]`` and ``x.reshape(4, 1)``, strides (8, 0)
    and (8, 8)) have one key."""
    key = array_key(x)
    shape = key[1]
    if 1 not in shape:
        return key
    return (key[0], shape, tuple(0 if n == 1 else s for n, s in zip(shape, key[2])), key[3])


def _one_object_per_array(annotated: Any) -> list[Annotation]:
    """Arguments that are different views of the same elements in the same order (``x`` and
    ``x[:]``, ``x[:, None]`` and ``x.reshape(4, 1)``) get one object, so that
    ``_merged_autodiff`` merges their parameters."""
    annotated = list(annotated)
    for a in annotated:
        t = type(a.val)
        if not (t is float or t is int or t is np.ndarray and a.val.base is None):
            break
    else:
        return annotated        # arrays that own their memory share it only if identical
    first: dict[tuple, Any] = {}
    out = []
    for a in annotated:
        if is_array(a.val):
            v = first.setdefault(elements_key(a.val), a.val)
            if v is not a.val:
                a = copy.copy(a)
                a.val = v
        out.append(a)
    return out


def _merged_autodiff(mode: Mode, cfg: ConfiguredKernel, ret: Any, annotated: list[Annotation],
                     ndrange: Any, accumulate: bool) -> tuple | None:
    """``tg.autodiff`` of a launch that passes one array for several parameters: the kernel
    with those parameters merged (``runtime.launch.one_parameter_per_array``), given the same
    annotation and shadow everywhere; the derivatives come back per original argument.
    None when no array is passed twice (a scalar object can be)."""
    values = tuple(plain(a.val) for a in annotated)
    merged_cfg, kept_args, kept = one_parameter_per_array(cfg, tuple(annotated), values)
    if merged_cfg is cfg:
        return None
    first: dict[int, Annotation] = {}
    for a in annotated:
        if not is_array(a.val):
            continue
        b = first.setdefault(id(a.val), a)
        if b is not a and not _same_annotation(a, b):
            how = (f"as tg.{type(b).__name__} and tg.{type(a).__name__}"
                   if type(a) is not type(b) else "with different shadows")
            raise TapegradError(
                f"{cfg.kernel.name}: one array is passed for several arguments {how}; it is "
                "one array with one shadow: give each the same annotation and the same shadow, "
                "e.g. dx = tg.make_zero(x) and tg.Duplicated(x, dx) for both")
    out = autodiff_kernel(mode, merged_cfg, ret, kept_args, ndrange, accumulate)
    if not mode.reverse:
        return out
    derivs = [None] * len(annotated)
    for pos, d in zip(kept, out[0]):
        derivs[pos] = d
    return (tuple(derivs),) + out[1:]


def _same_annotation(a: Annotation, b: Annotation) -> bool:
    """Same annotation class and the same shadow(s): one object, or views of one memory."""
    if type(a) is not type(b):
        return False
    da, db = getattr(a, "dval", None), getattr(b, "dval", None)
    pairs = zip(da, db) if isinstance(da, tuple) and isinstance(db, tuple) and \
        len(da) == len(db) else [(da, db)]
    return all(x is y or (is_array(x) and is_array(y) and elements_key(x) == elements_key(y))
               for x, y in pairs)


def _seeds(kernel: Any, params: list[str], annotated: list[Annotation]) -> frozenset[str]:
    """For ``accumulate=False``: the Duplicated arrays the kernel writes, whose shadows are
    seeds (the others' shadows are results); an array it reads and writes would be both."""
    read, written = access(kernel)
    for p, a in zip(params, annotated):
        if isinstance(a, Duplicated) and p in read and p in written:
            raise TapegradError(
                f"{kernel.name} reads and writes {p}, so with accumulate=False its shadow would "
                f"be both a seed and a result. Use the default (accumulate=True): seed "
                f"d{p}, and it holds the derivative with respect to {p}'s old values after")
    return frozenset(p for p, a in zip(params, annotated)
                     if isinstance(a, Duplicated) and p in written)


def one_object_per_memory(kernel: Any, shadows: dict[str, Any]) -> dict[str, Any]:
    """Shadows given as different views of the same memory become one object (the launch
    separates shadows that are one array, see ``runtime.adjoint.run_adjoint``); views that share
    some of their elements are refused."""
    arrays = list(shadows.values())
    if all(type(d) is np.ndarray and d.base is None for d in arrays) or (
            len({id(d) for d in arrays}) == len(arrays) and disjoint(arrays)):
        return shadows          # (arrays that own their memory share it only if identical)
    seen: dict[tuple, Any] = {}
    shadows = {p: seen.setdefault(elements_key(d), d) for p, d in shadows.items()}
    for p, q in sharing_pairs(list(shadows.items())):
        if shadows[p] is not shadows[q]:
            raise LaunchError(f"{kernel.name}: the shadows of {q} and {p} share some of their "
                              "elements; pass separate arrays (or the same array for both)")
    return shadows


def _check_seeds_apart(kernel: Any, shadows: dict[str, Any]) -> None:
    """One shadow object for several arrays the kernel only reads collects their gradients;
    for an array it writes, that shadow is a seed the adjoint consumes.  Refused before the
    primal launch (the adjoint launch refuses it too, runtime/adjoint.py, after the primal
    launch has written the outputs)."""
    if len({id(d) for d in shadows.values()}) == len(shadows):
        return
    written = access(kernel)[1]
    sharing: dict[int, list[str]] = {}
    for p, d in shadows.items():
        sharing.setdefault(id(d), []).append(p)
    for group in sharing.values():
        if len(group) > 1 and any(p in written for p in group):
            raise LaunchError(f"{kernel.name}: one shadow array is given for {', '.join(group)}, "
                              "and the kernel writes one of them: its shadow is a seed the "
                              "adjoint consumes, not a gradient to add to; give each array its "
                              "own shadow")


def _check_separate(kernel: Any, shadows: dict[str, Any]) -> None:
    """With ``accumulate=False`` results are written while seeds are read: no two shadows may
    share memory (checked before anything runs)."""
    for p, q in sharing_pairs(list(shadows.items())):
        raise TapegradError(
            f"{kernel.name}: with accumulate=False the shadows of {q} and {p} share memory, "
            "so one would be overwritten while the other is read; pass separate arrays")


def _primal_needed(kernel: Any, params: list[str], annotated: list[Annotation]) -> bool:
    """False when every array the kernel writes is ``DuplicatedNoNeed``: nobody wants its
    primal results, and the adjoint launch recomputes whatever it needs from the inputs, so
    the primal launch is skipped (as ``jax.grad`` computes no value) and those arrays keep
    their old contents."""
    _, written = access(kernel)
    return any(not isinstance(annotated[params.index(p)], DuplicatedNoNeed) for p in written)


def floats(x: Any) -> bool:
    """Whether array ``x`` holds floats (by its kind's dtype: PyTorch's are not NumPy's)."""
    kind = kind_of(x)
    return (kind.dtype(x) if kind is not None else np.dtype(x.dtype)).kind == "f"


def no_derivative(owner: str, name: Any, x: Any, what: str = "derivative") -> TapegradError:
    """The refusal of an integer (or boolean) array annotated ``Duplicated``, said before its
    shadow is looked at: no shadow would make it differentiable.  ``name``: a parameter's
    name, or ``argument k`` of a host function."""
    return TapegradError(f"{owner}: {name} is an array of {x.dtype}, and integer "
                         f"and boolean arrays carry no {what}; pass it as "
                         f"tg.Const({_as_code(name)}) or as it is, without a shadow")


def check_layout(owner: str, name: Any, d: Any, what: str = "shadow") -> None:
    """A device array given as a shadow (``what``: or a tangent) must be C-contiguous: the
    device kernels take no other (their launchers' rule: ``_buffer`` in
    backends/opencl/backend.py, ``buffer`` in backends/cuda/backend.py), nor do PyOpenCL's
    host operations that seed and zero it.  Refused before anything runs: the adjoint launch,
    the first to take the shadow, comes after the primal launch and the seeding.  NumPy
    arrays (the CPU's kernels) take any strides."""
    kind = kind_of(d)
    if kind is None or kind.host or not getattr(d, "size", 0):
        return
    flags = getattr(d, "flags", None)
    if flags is None or flags.c_contiguous:
        return
    raise LaunchError(
        f"{owner}: the {what} of {name} is a view that skips elements (shape "
        f"{tuple(d.shape)}, strides {tuple(d.strides)}), and device kernels take C-contiguous "
        f"arrays only; pass a contiguous {what}, tg.make_zero({_as_code(name)}) (for a "
        "seed's values: tg.asarray(backend, tg.to_numpy(view))), and copy the part you need "
        "into the view afterwards")


def _as_code(name: Any) -> str:
    """A parameter's name as it is; ``x`` for a host function's ``argument k``."""
    return name if isinstance(name, str) and name.isidentifier() else "x"


def batch_in_reverse(owner: str) -> TapegradError:
    """The refusal of ``BatchDuplicated`` in reverse mode (``owner``: the kernel or function)."""
    return TapegradError(f"{owner}: BatchDuplicated (several tangents at once) is for forward "
                         "mode: use tg.autodiff(tg.Forward, ...); in reverse mode pass "
                         "Duplicated(x, dx) and sweep once per seed")


def _check_annotation(kernel: Any, backend: Any, name: str, a: Annotation) -> str:
    if isinstance(a, BatchDuplicated):
        raise batch_in_reverse(kernel.name)
    if isinstance(a, Duplicated):
        x, dx = a.val, a.dval
        if isinstance(x, (list, tuple)):
            raise TapegradError(f"{kernel.name}: argument {name} is a Python {type(x).__name__}; "
                                f"kernels take arrays: Duplicated(np.asarray({name}), "
                                f"np.zeros(len({name})))")
        if not hasattr(x, "shape"):
            raise TapegradError(f"{kernel.name}: argument {name} is a scalar; scalars are "
                                f"tg.Active({name}) or tg.Const({name}), not Duplicated")
        if not floats(x):      # (first: no shadow would do)
            raise no_derivative(kernel.name, name, x)
        if not hasattr(dx, "shape") or dx.shape != x.shape or dx.dtype != x.dtype:
            got = (f"shape {dx.shape}, dtype {dx.dtype}" if hasattr(dx, "shape")
                   else type(dx).__name__)
            raise LaunchError(f"{kernel.name}: the shadow of {name} must match it (shape "
                              f"{x.shape}, dtype {x.dtype}); got {got}. Make one with "
                              f"tg.make_zero({name})")
        if not backend.owns(dx):
            why = backend.not_here(f"d{name}", dx)
            raise LaunchError(f"{kernel.name}: the shadow of {name} does not live on {backend!r}"
                              + (f": {why}" if why else ""))
        check_layout(kernel.name, name, dx)
        return "dup"
    if isinstance(a, Active):
        if hasattr(a.val, "shape") and getattr(a.val, "ndim", 0) > 0:
            raise TapegradError(f"{kernel.name}: argument {name} is an array; arrays are "
                                f"tg.Duplicated({name}, d{name}), Active is for float scalars")
        if not isinstance(a.val, (float, np.floating)):
            raise TapegradError(f"{kernel.name}: tg.Active({name}) needs a float scalar, got "
                                f"{type(a.val).__name__}")
        return "active"
    return "const"
