"""A tapegrad kernel as a PyTorch layer, trained with torch.optim: a dense tanh layer written as
one kernel, wrapped with tapegrad.torch.function, inside an nn.Sequential fitting sin(3x).
Run: python examples/torch_layer.py"""

import numpy as np
import torch

import tapegrad as tg
import tapegrad.torch


@tg.kernel
def dense_tanh(out, x, W, b):
    n, i = tg.index(tg.Global, tg.NTuple)
    acc = b[i]
    for j in range(x.shape[1]):
        acc += W[i, j] * x[n, j]
    out[n, i] = tg.tanh(acc)


@tapegrad.torch.function
def layer(x, W, b):
    out = np.empty((x.shape[0], W.shape[0]), x.dtype)
    dense_tanh(tg.CPU(), (16, 16))(out, x, W, b, ndrange=out.shape)
    return out


class TapegradLayer(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.W = torch.nn.Parameter(torch.randn(n_out, n_in, dtype=torch.float64))
        self.b = torch.nn.Parameter(torch.zeros(n_out, dtype=torch.float64))

    def forward(self, x):
        return layer(x, self.W, self.b)


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.linspace(-1.0, 1.0, 64, dtype=torch.float64).reshape(-1, 1)
    y = torch.sin(3.0 * x)
    model = torch.nn.Sequential(TapegradLayer(1, 16), torch.nn.Linear(16, 1, dtype=torch.float64))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    for epoch in range(200):
        optimizer.zero_grad()
        loss = torch.mean((model(x) - y) ** 2)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if epoch % 50 == 0 or epoch == 199:
            print(f"epoch {epoch:3d}: loss {loss.item():.5f}")
    assert losses[-1] < losses[0] / 10, losses[::50]
    # the layer's gradient against torch's own finite differences
    probe, inputs = TapegradLayer(2, 3), torch.rand(4, 2, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda W, b: layer(inputs, W, b), (probe.W, probe.b))
    print("gradcheck of the layer: passed")
