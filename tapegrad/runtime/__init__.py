"""The runtime: a launch's arguments checked, its code found or compiled (primal, adjoint,
tangent) and run; ``kernel`` is the user's ``@tg.kernel`` on top of it."""
