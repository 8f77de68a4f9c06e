"""Run by ``scalebox_ms.doctor`` in a fresh process: ``python -m scalebox_ms._backend_probe CPU|GPU|Ascend``.

Compiles a small Dense layer's forward and gradient with ``@ms.jit`` on the given backend and compares both
with numpy; prints one JSON line ``{"ok": bool, "seconds": float}``.
"""
import json
import sys
import time

import numpy as np


def main(target: str) -> None:
    import mindspore as ms
    from mindspore import nn

    ms.set_context(device_target=target)
    t0 = time.perf_counter()
    net = nn.Dense(4, 3)
    w, b = net.weight.asnumpy().astype(np.float64), net.bias.asnumpy().astype(np.float64)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)

    def loss(inp):
        return (net(inp) ** 2).sum()

    grad = ms.grad(loss, grad_position=None, weights=net.trainable_params())

    @ms.jit
    def step(inp):
        return net(inp), grad(inp)

    y, (gw, gb) = step(ms.Tensor(x))
    ref = x @ w.T + b
    ok = (np.allclose(y.asnumpy(), ref, atol=1e-4) and np.allclose(gw.asnumpy(), 2 * ref.T @ x, atol=1e-3)
          and np.allclose(gb.asnumpy(), 2 * ref.sum(0), atol=1e-3))
    print(json.dumps({"ok": bool(ok), "seconds": time.perf_counter() - t0}))


if __name__ == "__main__":
    main(sys.argv[1])
