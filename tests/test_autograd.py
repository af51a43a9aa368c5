"""Autograd: every Tensor-level backward rule against central finite differences in float64."""
import numpy as np
import pytest

import netcl as nc
from nn_reference import finite_difference
from util import assert_close


def check(fn, *arrays, tol=1e-6):
    """fn maps Tensors to a Tensor; compares the gradient of sum(fn(...) * w) for each input."""
    tensors = [nc.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*tensors)
    w = np.random.default_rng(0).standard_normal(out.shape)
    (out * nc.tensor(w)).sum().backward()
    for k, (t, a) in enumerate(zip(tensors, arrays)):
        def scalar(v, k=k):
            args = [nc.tensor(v if j == k else arrays[j]) for j in range(len(arrays))]
            return float((fn(*args).to_host() * w).sum())
        assert t.grad is not None, f"no gradient for input {k}"
        assert_close(t.grad.to_host(), finite_difference(scalar, a), tol, f"input {k}")


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
def test_binary_grads_with_broadcast(op, rng):
    a = rng.uniform(0.5, 2, (3, 1, 5))
    b = rng.uniform(0.5, 2, (4, 1))
    f = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
         "div": lambda x, y: x / y, "pow": lambda x, y: x ** y}[op]
    check(f, a, b)


@pytest.mark.parametrize("name", ["exp", "log", "tanh", "relu", "sqrt", "sigmoid", "neg"])
def test_unary_grads(name, rng):
    x = rng.uniform(0.2, 2, (7, 3)) * rng.choice([-1, 1], (7, 3)) if name in ("tanh", "relu", "neg", "sigmoid") \
        else rng.uniform(0.2, 2, (7, 3))
    check(lambda t: -t if name == "neg" else getattr(t, name)(), x)


def test_reduction_grads(rng):
    x = rng.standard_normal((3, 7, 5))
    check(lambda t: t.sum(axis=1), x)
    check(lambda t: t.mean(axis=(0, 2), keepdims=True), x)
    check(lambda t: t.max(axis=2), x)
    check(lambda t: t.sum(), x)


def test_view_grads(rng):
    x = rng.standard_normal((4, 6, 5))
    check(lambda t: t[1:, ::2, 3].reshape(-1), x)
    check(lambda t: t.permute(2, 0, 1).contiguous() * 2.0, x)
    check(lambda t: t.transpose(0, 2)[..., 1:], x)
    check(lambda t: t[:, :1].expand(4, 3, 5), x)


def test_matmul_grads(rng):
    check(lambda a, b: a @ b, rng.standard_normal((7, 13)), rng.standard_normal((13, 5)))
    check(lambda a, b: a @ b, rng.standard_normal((3, 7, 4)), rng.standard_normal((4, 5)))


def test_shared_subgraph_and_accumulation(rng):
    x = nc.tensor(rng.standard_normal(5), requires_grad=True)
    y = x * x
    z = (y + y * 3).sum()  # y used twice: gradients add up
    z.backward()
    np.testing.assert_allclose(x.grad.to_host(), 8 * x.to_host(), rtol=1e-12)
    (x * 2).sum().backward()  # a second backward accumulates into .grad
    np.testing.assert_allclose(x.grad.to_host(), 8 * x.to_host() + 2, rtol=1e-12)


def test_no_grad_and_detach():
    x = nc.tensor(np.ones(3), requires_grad=True)
    with nc.no_grad():
        y = x * 2
    assert not y.requires_grad
    assert not x.detach().requires_grad
    with pytest.raises(RuntimeError):
        y.sum().backward()
    with pytest.raises(nc.ShapeError):
        (x * 2).backward()  # non-scalar without a gradient
