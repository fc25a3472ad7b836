"""Differentiation of kernels by source transformation (kernel IR -> kernel IR)."""

from tapegrad.ad.adjoint import Adjoint
from tapegrad.ad.forward import Tangent, tangent_kernel
from tapegrad.ad.normalize import normalize
from tapegrad.ad.reverse import reverse_kernel

__all__ = ["normalize", "reverse_kernel", "Adjoint", "tangent_kernel", "Tangent"]
