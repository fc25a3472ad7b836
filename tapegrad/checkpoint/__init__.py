"""Checkpointing for long simulations: ``tg.checkpoint_loop`` (``loop.py``) on the binomial
schedule of ``revolve.py``."""
