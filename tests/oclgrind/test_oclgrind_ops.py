"""Everything that is not convolution or GEMM, under the simulator: elementwise maps (contiguous and
strided, broadcasting, every unary op, casts), strided copies, reductions (one and several chunks, argmax,
the mean of rows that averages data-parallel gradients),
random fills, cross-entropy, the optimizers' fused updates, pooling in all its kernel variants, a small
network through autograd, the dense (pixelwise) conversion, and the benchmark-only kernels. Each result is
checked against NumPy, so the tests mean something on any device."""
from __future__ import annotations

import numpy as np
import pytest

import netcl as nc
from netcl.nn import functional as F
from util import assert_close

pytestmark = pytest.mark.oclgrind


def _dtypes(device):
    return ["float32"] + (["float64"] if device.has_fp64 else [])


def _t(a, device, grad=False):
    return nc.Tensor.from_host(a, device, requires_grad=grad)


def test_elementwise_and_copies(device, rng):
    for dt in _dtypes(device):
        a = rng.uniform(0.5, 2, (3, 1, 5)).astype(dt)
        b = rng.uniform(0.5, 2, (4, 5)).astype(dt)
        A, B = _t(a, device), _t(b, device)
        for got, want in (((A + B), a + b), ((A - B), a - b), ((A * B), a * b), ((A / B), a / b),
                          ((A ** B), a ** b), ((2.0 - A), 2.0 - a), ((-A), -a)):
            assert_close(got.to_host(), want, 1e-6, "binary")
        for op in ("relu", "exp", "log", "tanh", "sqrt", "abs", "sigmoid"):
            want = {"relu": np.maximum(a, 0), "sigmoid": 1 / (1 + np.exp(-a))}.get(op)
            want = getattr(np, op)(a) if want is None else want
            assert_close(getattr(A, op)().to_host(), want, 1e-6, op)
        assert np.array_equal((A > B).to_host(), (a > b).astype((A > B).dtype))
        # strided views: a permuted, sliced operand takes the NDIM > 0 path; contiguous() the strided copy
        v = _t(rng.uniform(-1, 1, (4, 6, 5)).astype(dt), device)
        view = v.permute(2, 0, 1)[1:4, :, ::2]
        host = v.to_host().transpose(2, 0, 1)[1:4, :, ::2]
        assert_close(view.contiguous().to_host(), host, 0, "strided copy")
        assert_close((view * 3.0).to_host(), host * 3.0, 1e-6, "strided map")
        assert_close(A.astype(np.float64 if dt == "float32" else np.float32).to_host(), a, 1e-6, "cast")
    ints = _t(np.arange(-5, 6, dtype=np.int32), device)
    assert np.array_equal((ints * 2 + 1).to_host(), np.arange(-5, 6) * 2 + 1)
    assert np.array_equal(ints.astype(np.int64).to_host(), np.arange(-5, 6))


def test_reductions(device, rng):
    for dt in _dtypes(device):
        a = rng.uniform(-1, 1, (3, 7, 5)).astype(dt)
        A = _t(a, device)
        tol = 1e-6 if dt == "float32" else 1e-14
        for axis in (None, 0, 1, 2, (0, 2)):
            # sums of ±1 terms can be near 0: bound the error by the sum of magnitudes, not by the result
            scale = np.abs(a).sum(axis=axis)
            for op, ref in (("sum", a.sum(axis=axis)), ("mean", a.mean(axis=axis) * 1.0)):
                got = getattr(A, op)(axis=axis).to_host()
                bound = tol * (scale if op == "sum" else scale / (a.size / np.size(ref)))
                assert np.all(np.abs(got - ref) <= bound), f"{op} over {axis}: off by {np.abs(got - ref).max()}"
            assert_close(A.max(axis=axis).to_host(), a.max(axis=axis), 0, f"max {axis}")
        assert np.array_equal(A.argmax(1).to_host(), a.argmax(1))
        # longer than one chunk (2048): the second pass reduces the chunk results
        long = rng.uniform(-1, 1, (2, 4099)).astype(dt)
        L = _t(long, device)
        # a sum of ±1 terms is near 0: bound the error by the sum of magnitudes, not by the result
        err = np.abs(L.sum(axis=1).to_host() - long.astype(np.float64).sum(axis=1))
        bound = (1e-5 if dt == "float32" else 1e-12) * np.abs(long).sum(axis=1)
        assert np.all(err <= bound), f"chunked sum off by {err}"
        assert np.array_equal(L.argmax(1).to_host(), long.argmax(1))
    ints = _t(np.arange(2 * 3000, dtype=np.int64).reshape(2, 3000), device)
    assert np.array_equal(ints.sum(axis=1).to_host(), np.arange(6000).reshape(2, 3000).sum(axis=1))


def test_mean_of_rows(device, rng):
    """DistributedDataParallel's device averaging: a parameter's slice of every rank's bucket row."""
    from netcl.ops.reduce import MeanOfRows
    for dt in _dtypes(device):
        for rows, count, start in ((1, 1, 0), (2, 13, 3), (3, 70, 1)):
            width = start + count + 2
            a = rng.uniform(-1, 1, (rows, width)).astype(dt)
            A = _t(a, device)
            out = nc.Tensor.empty((count,), dt, device)
            MeanOfRows(A._view((rows, count), (width, 1), A.offset + start))(out)
            assert_close(out.to_host(), np.sum(a[:, start:start + count], axis=0) * a.dtype.type(1.0 / rows), 0,
                         f"mean of {rows} rows")


def test_random_fills(device):
    for dt in _dtypes(device):
        u = nc.rand(3, 33, seed=1, device=device, dtype=dt).to_host()
        n = nc.randn(3, 33, seed=2, device=device, dtype=dt).to_host()
        assert u.dtype == dt and u.min() >= 0 and u.max() < 1 and np.isfinite(n).all() and n.std() > 0.3
    x = _t(np.ones((5, 13), np.float32), device)
    kept = F.dropout(x, 0.5, training=True, seed=3).to_host()
    assert set(np.unique(kept)) <= {0.0, 2.0}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(reduction, device, rng):
    for dt in _dtypes(device):
        for tdt in (np.int32, np.int64):
            logits = rng.uniform(-3, 3, (7, 5)).astype(dt)
            target = rng.integers(0, 5, 7).astype(tdt)
            X = _t(logits, device, grad=True)
            loss = F.cross_entropy(X, _t(target, device), reduction=reduction)
            z = logits.astype(np.float64) - logits.max(1, keepdims=True)
            logp = z - np.log(np.exp(z).sum(1, keepdims=True))
            scale = 1 / 7 if reduction == "mean" else 1.0
            assert_close(loss.to_host(), -logp[np.arange(7), target].sum() * scale, 1e-6, "ce")
            loss.backward()
            onehot = np.eye(5)[target]
            assert_close(X.grad.to_host(), (np.exp(logp) - onehot) * scale, 1e-5, "ce grad")


def test_optimizers(device, rng):
    for dt in _dtypes(device):
        p0 = rng.uniform(-1, 1, (13,)).astype(dt)
        g = rng.uniform(-1, 1, (13,)).astype(dt)
        for kind, kw in (("sgd", {}), ("sgd", {"momentum": 0.9}), ("sgd", {"momentum": 0.9, "nesterov": True}),
                         ("sgd", {"momentum": 0.5, "weight_decay": 0.1, "dampening": 0.1}),
                         ("adam", {}), ("adam", {"weight_decay": 0.1})):
            p = _t(p0, device, grad=True)
            opt = nc.optim.SGD([p], lr=0.1, **kw) if kind == "sgd" else nc.optim.Adam([p], lr=0.1, **kw)
            ref, state = p0.astype(np.float64), {}
            for step in range(1, 3):
                p.grad = _t(g, device)
                opt.step()
                ref = _reference_step(kind, kw, ref, g.astype(np.float64), state, step)
            assert_close(p.to_host(), ref, 1e-5, f"{kind} {kw}")


def _reference_step(kind, kw, p, g, state, t):
    g = g + kw.get("weight_decay", 0.0) * p
    if kind == "sgd":
        m = kw.get("momentum", 0.0)
        if m:
            buf = g if "buf" not in state else m * state["buf"] + (1 - kw.get("dampening", 0.0)) * g
            state["buf"] = buf
            g = g + m * buf if kw.get("nesterov") else buf
        return p - 0.1 * g
    b1, b2 = 0.9, 0.999
    state["m"] = b1 * state.get("m", 0) + (1 - b1) * g
    state["v"] = b2 * state.get("v", 0) + (1 - b2) * g * g
    mhat, vhat = state["m"] / (1 - b1 ** t), state["v"] / (1 - b2 ** t)
    return p - 0.1 * mhat / (np.sqrt(vhat) + 1e-8)


# (kernel, stride, padding, dilation): disjoint covering windows, disjoint with gaps, overlapping, padded,
# dilated
POOLS = [(2, 2, 0, 1), (2, 3, 0, 1), (3, 1, 1, 1), (3, 2, 1, 1), (2, 1, 0, 2), ((3, 2), (2, 1), (1, 0), 1)]


def _pool_ref(x, op, k, s, p, d, count_include_pad=True):
    kh, kw = (k, k) if isinstance(k, int) else k
    sh, sw = (s, s) if isinstance(s, int) else s
    ph, pw = (p, p) if isinstance(p, int) else p
    dh, dw = (d, d) if isinstance(d, int) else d
    n, c, h, w = x.shape
    ho, wo = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1, (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    fill = -np.inf if op == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    inside = np.pad(np.ones((h, w)), ((ph, ph), (pw, pw)))
    taps = [xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
            for i in range(kh) for j in range(kw)]
    if op == "max":
        return np.max(taps, axis=0)
    counts = sum(inside[i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]
                 for i in range(kh) for j in range(kw))
    return np.sum(taps, axis=0) / (kh * kw if count_include_pad else counts)


@pytest.mark.parametrize("geometry", POOLS, ids=[str(g) for g in POOLS])
def test_pooling(geometry, device, rng):
    k, s, p, d = geometry
    # narrow rows: every column an edge column; wide rows: the vector block kernels
    for dt, shape in [(dt, shape) for dt in _dtypes(device) for shape in ((2, 3, 7, 8), (1, 2, 5, 37))]:
        x = rng.uniform(-1, 1, shape).astype(dt)
        for op, kw in (("max", {}), ("max", {"fused_relu": True}), ("avg", {"count_include_pad": True}),
                       ("avg", {"count_include_pad": False})):
            X = _t(x, device, grad=True)
            fn = F.max_pool2d if op == "max" else F.avg_pool2d
            y = fn(X, k, s, p, dilation=d, **kw)
            source = np.maximum(x, 0) if kw.get("fused_relu") else x
            ref = _pool_ref(source, op, k, s, p, d, kw.get("count_include_pad", True))
            assert_close(y.to_host(), ref, 1e-6, f"{op} pool {kw}")
            y.sum().backward()
            g = X.grad.to_host()
            assert g.shape == x.shape and np.isfinite(g).all()
            # every output's gradient of 1 lands somewhere: the totals agree
            expected_total = y.size if op == "max" else ref.size * 1.0
            if op == "max" and kw.get("fused_relu"):
                expected_total = float((ref > 0).sum())
            if op == "max":
                assert abs(g.sum() - expected_total) < 1e-4, f"{op} pool {kw}: gradient mass {g.sum()}"
                with nc.no_grad():  # inference: the kernels' variant that writes no argmax
                    assert_close(fn(_t(x, device), k, s, p, dilation=d, **kw).to_host(), ref, 1e-6,
                                 f"{op} pool {kw} without argmax")


def test_small_network_trains(device, rng):
    nc.nn.init.manual_seed(0)
    model = nc.nn.Sequential(nc.nn.Conv2d(1, 3, 3, padding=1), nc.nn.ReLU(), nc.nn.MaxPool2d(2),
                             nc.nn.Flatten(), nc.nn.Linear(3 * 3 * 3, 4), nc.nn.Tanh(), nc.nn.Dropout(0.2),
                             nc.nn.Linear(4, 3))
    opt = nc.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = _t(rng.uniform(-1, 1, (5, 1, 7, 6)).astype(np.float32), device)
    y = _t(rng.integers(0, 3, 5).astype(np.int64), device)
    losses = []
    for _ in range(3):
        opt.zero_grad()
        loss = nc.nn.CrossEntropyLoss()(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    assert all(np.isfinite(losses))


def test_dense_conversion_matches_patches(device, rng):
    nc.nn.init.manual_seed(1)
    model = nc.nn.Sequential(nc.nn.Conv2d(1, 2, 3), nc.nn.ReLU(), nc.nn.MaxPool2d(2), nc.nn.Flatten(),
                             nc.nn.Linear(2 * 2 * 2, 3))
    model.eval()
    dense = nc.dense.convert(model, 6)
    image = rng.uniform(-1, 1, (1, 1, 5, 7)).astype(np.float32)
    scores = dense(_t(image, device)).to_host()
    patches = nc.dense.scan_patches(model, image[0]).to_host()
    assert_close(scores[0].reshape(3, -1).T, patches, 1e-5, "dense vs patches")


def test_benchmark_only_kernels(device, rng):
    """The yardsticks `netcl bench` compares against: the textbook GEMM, the Caffe-style im2col and the
    copy-bandwidth kernel, launched the way the benchmarks launch them, on ragged sizes."""
    from netcl.bench.gemm import _textbook
    from netcl.ops.im2col import _layer, _params, cols_shape, im2col
    from netcl.runtime.kernels import get_kernel, launch, local_size_1d
    M, N, K = 19, 21, 7
    a, b = rng.uniform(-1, 1, (M, K)).astype(np.float32), rng.uniform(-1, 1, (K, N)).astype(np.float32)
    c = nc.empty((M, N), device=device)
    _textbook(device, _t(a, device), _t(b, device), c, M, N, K)()
    assert_close(c.to_host(), a.astype(np.float64) @ b, 1e-5, "textbook gemm")

    shape = (2, 3, 6, 7)
    x = _t(rng.uniform(-1, 1, shape).astype(np.float32), device)
    layer = _layer(shape, 3, 2, 1, 0, 1, "float32")
    caffe = nc.empty(cols_shape(layer, True), device=device)
    local = local_size_1d(device, caffe.size)[0]
    kernel = get_kernel(device, "im2col.cl", "im2col_caffe", **_params(layer, np.float32, True, local))
    items = layer.n * layer.c * layer.out_h * layer.out_w
    launch(device, kernel, (items,), (local,), x.buffer, np.int64(x.offset), caffe.buffer, np.int64(caffe.offset))
    assert np.array_equal(caffe.to_host(), im2col(x, 3, 2, transposed=True).to_host())

    for per_item in (1, 16):
        n = 1000
        src, dst = _t(rng.uniform(-1, 1, n).astype(np.float32), device), nc.empty((n,), device=device)
        copy = get_kernel(device, "im2col.cl", "copy_bandwidth", VEC=per_item)
        launch(device, copy, (-(-n // per_item),), None, src.buffer, dst.buffer, np.int64(n))
        assert np.array_equal(dst.to_host(), src.to_host())


def test_bias_kernels(device, rng):
    """Both bias_add forms (channels in the middle: a conv output; channels last: a linear output) and
    the bias gradient."""
    from netcl.ops.bias import add_bias_, bias_grad
    for shape, axis in (((2, 3, 5), 1), ((3, 7), 1)):
        y = rng.standard_normal(shape).astype(np.float32)
        b = rng.standard_normal(shape[axis]).astype(np.float32)
        bshape = [1] * len(shape)
        bshape[axis] = shape[axis]
        assert_close(add_bias_(_t(y, device), _t(b, device), axis).to_host(), y + b.reshape(bshape), 1e-6, "bias_add")
        others = tuple(i for i in range(len(shape)) if i != axis)
        assert_close(bias_grad(_t(y, device), axis).to_host(), y.astype(np.float64).sum(axis=others), 1e-5,
                     "bias_grad")


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_transpose_both_forms(kind, device, rng, monkeypatch):
    """The batched strided transpose's direct (CPU) and local-memory (GPU) forms, with split rows and
    columns and partial blocks (MEC's output permutation)."""
    from netcl.ops.transpose import transpose_into
    monkeypatch.setattr(device, "kind", kind)
    n, k, p, q = 2, 37, 3, 5
    o = rng.standard_normal((p, n, q, k)).astype(np.float32)
    dst = nc.Tensor.empty((n, k, p, q), np.float32, device)
    transpose_into(dst, _t(o, device), rows=n * q, cols=k, src_row_stride=k, row_split=(q, k * p * q),
                   col_split=(k, 0, p * q), batches=p, batch_strides=(n * q * k, q))
    assert np.array_equal(dst.to_host(), o.transpose(1, 3, 0, 2))
