"""Interop with other array and autodiff libraries (``tapegrad.torch``, ``tapegrad.jax``)."""
