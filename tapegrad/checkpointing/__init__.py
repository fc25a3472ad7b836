"""Checkpointing for long simulations: ``tg.checkpoint_loop`` (``loop.py``) on the binomial
schedule of ``revolve.py``, and ``tg.checkpoint`` (``segment.py``) for one segment; what either
may read from outside is checked in ``closure.py``."""
