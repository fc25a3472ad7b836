"""A tapegrad simulation inside a JAX program: recover a rod's conductivity from its final
temperature with jax.jit(jax.value_and_grad(...)) through 200 kernel launches.
Run: python examples/jax_fit.py"""

import jax
import jax.numpy as jnp
import numpy as np

import tapegrad as tg
import tapegrad.jax

jax.config.update("jax_enable_x64", True)


@tg.kernel
def heat_step(out, u, kappa):
    i = tg.index()
    n = u.shape[0]
    if i == 0 or i == n - 1:
        out[i] = u[i]
    else:
        out[i] = u[i] + kappa * (u[i - 1] - 2.0 * u[i] + u[i + 1])


@tapegrad.jax.function
def simulate(u0, kappa):
    u = u0
    for _ in range(200):
        out = np.empty_like(u)
        heat_step(tg.CPU())(out, u, kappa, ndrange=u.size)
        u = out
    return u


if __name__ == "__main__":
    u0 = jnp.where(jnp.arange(64) < 16, 1.0, 0.0)
    observed = simulate(u0, 0.21)                      # made with the conductivity to find

    @jax.jit
    def loss_and_grad(kappa):
        return jax.value_and_grad(lambda k: jnp.sum((simulate(u0, k) - observed) ** 2))(kappa)

    kappa = jnp.asarray(0.1)
    first = None
    for it in range(40):
        loss, g = loss_and_grad(kappa)
        first = float(loss) if first is None else first
        kappa = kappa - 2.0 * loss / (g + jnp.sign(g) * 1e-30)    # Gauss-Newton: loss ~ c (k - k*)^2
        kappa = jnp.clip(kappa, 0.01, 0.45)
        if it % 10 == 0 or loss < 1e-20:
            print(f"iteration {it:2d}: loss {float(loss):.3e}, kappa {float(kappa):.6f}")
        if loss < 1e-20:
            break
    print(f"recovered kappa = {float(kappa):.6f} (true 0.21)")
    assert float(loss) < first * 1e-6 and abs(float(kappa) - 0.21) < 1e-4
