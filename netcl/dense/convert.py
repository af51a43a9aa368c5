"""Algorithm 1 of Li, Zhao & Wang: turn a patch classifier into a network that labels every pixel at once.

The patch around pixel (i, j) of an H×W image, for an n_h×n_w patch classifier, is the n_h×n_w window
whose top-left corner is (i − ⌊n_h/2⌋, j − ⌊n_w/2⌋), zero outside the image (for odd n the pixel is the
centre; for even n it is the lower-right of the four central pixels). The dense model pads the image by
⌊n/2⌋ before and n − 1 − ⌊n/2⌋ after (the paper's ⌊n/2⌋ on both sides for odd n, one row less at the
bottom/right for even n, where the paper's padding would give one extra output row) and returns an H×W
score map per class whose pixel (i, j) equals the original model's scores for that patch.

Every stride becomes 1 and each conv/pool kernel is dilated by the product d of the strides before it (the
d-regularly sparse kernels: the dilation is a kernel parameter, no zeros are stored). A Linear layer after
Flatten becomes a convolution whose weight is a reshape view of the Linear's weight, so the dense model
trains the original parameters.

Zero padding inside the classifier (a Conv2d or pooling layer with padding > 0) is where dense and
patch-by-patch scanning part ways: a patch's feature map is padded at the patch's border, but in the dense
map that border holds the features of the neighbouring pixels. The conversion stays exact by tracking, per
axis, which patch positions see a border (their "class"): positions with the same class share one dense map,
and a position near the border reads only the kernel taps that fall inside the patch. A classifier without
internal padding has a single class per axis and runs exactly Algorithm 1; each padded layer adds a few
small extra maps.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError, ShapeError
from .. import nn as L  # the public layer names, wherever netcl.nn defines them
from ..nn import functional as F
from ..module import Module
from ..ops.conv_common import pair
from ..tensor import Tensor


class PatchGeometryError(ShapeError):
    """The patch size does not fit the classifier (raised while converting; infer_patch_size skips these)."""


@dataclass(frozen=True)
class Axis:
    """One spatial axis of a layer's input, seen from a single patch.

    m        extent of the patch's feature map along this axis
    classes  class of each patch position: positions of one class are computed by the same dense map
    d        spacing in the dense map between neighbouring patch positions (the product of strides so far)
    """

    m: int
    classes: tuple
    d: int

    @property
    def n_classes(self) -> int:
        return max(self.classes) + 1

    def length(self, image: int) -> int:
        """Extent of this axis's dense maps for an image of ``image`` pixels: position a of the patch around
        pixel u sits at u + d·a."""
        return image + self.d * (self.m - 1)


def advance(axis: Axis, r: int, s: int, p: int, dil: int, what: str):
    """The axis after a kernel of r taps (stride s, padding p, dilation dil), and the signature of each
    output class: the class each tap reads, −1 for a tap in the padding."""
    m_out = (axis.m + 2 * p - dil * (r - 1) - 1) // s + 1
    if m_out < 1:
        raise PatchGeometryError(f"{what}: kernel {r} (dilation {dil}, padding {p}) does not fit the {axis.m}-pixel "
                         "feature map a patch has at this layer; the patch size is too small for this model")
    signatures, classes = [], []
    for b in range(m_out):
        sig = tuple(axis.classes[i] if 0 <= (i := b * s - p + t * dil) < axis.m else -1 for t in range(r))
        if sig not in signatures:
            signatures.append(sig)
        classes.append(signatures.index(sig))
    return Axis(m_out, tuple(classes), axis.d * s), signatures


def tap_runs(signature, cls: int):
    """Maximal runs [t0, t1) of consecutive taps that read input class ``cls``."""
    runs, start = [], None
    for t, c in enumerate(tuple(signature) + (None,)):
        if c == cls and start is None:
            start = t
        elif c != cls and start is not None:
            runs.append((start, t))
            start = None
    return runs


@dataclass
class Spatial:
    """A conv, pooling or Linear layer run densely: per output class (ch, cw), a list of groups
    (ih, iw, (h0, h1), (w0, w1)): taps h0..h1−1 × w0..w1−1 of the kernel read input class (ih, iw)."""

    name: str
    module: Module
    kind: str  # "conv" | "linear" | "max" | "avg"
    kernel: tuple
    padding: tuple
    dilation: tuple
    axes_in: tuple
    axes_out: tuple
    groups: dict
    divisors: dict  # avg pooling: the number of taps each output class divides by
    in_channels: int | None

    @classmethod
    def make(cls, name, module, kind, kernel, stride, padding, dilation, axes_in, in_channels):
        what = f"layer {name!r} ({type(module).__name__})"
        out_h, sigs_h = advance(axes_in[0], kernel[0], stride[0], padding[0], dilation[0], what)
        out_w, sigs_w = advance(axes_in[1], kernel[1], stride[1], padding[1], dilation[1], what)
        groups, divisors = {}, {}
        for ch, sh in enumerate(sigs_h):
            for cw, sw in enumerate(sigs_w):
                groups[ch, cw] = [(ih, iw, rh, rw) for ih in range(axes_in[0].n_classes)
                                  for iw in range(axes_in[1].n_classes)
                                  for rh in tap_runs(sh, ih) for rw in tap_runs(sw, iw)]
                valid = sum(c >= 0 for c in sh) * sum(c >= 0 for c in sw)
                count_pad = kind != "avg" or module.count_include_pad
                divisors[ch, cw] = kernel[0] * kernel[1] if count_pad else valid
        return cls(name, module, kind, tuple(kernel), tuple(padding), tuple(dilation), tuple(axes_in),
                   (out_h, out_w), groups, divisors, in_channels)

    @property
    def dense_dilation(self) -> tuple:
        return (self.axes_in[0].d * self.dilation[0], self.axes_in[1].d * self.dilation[1])

    def weight(self) -> Tensor:
        w = self.module.weight
        if self.kind == "linear":  # the same buffer seen as (out, C, m_h, m_w): no copy, gradients flow back
            return w.reshape((w.shape[0], self.in_channels) + self.kernel)
        return w

    def __call__(self, maps: dict, image_hw, strategy) -> dict:
        from ..autograd.rules_dense import Maximum, Window
        dh, dw = self.dense_dilation
        lh = self.axes_out[0].length(image_hw[0])
        lw = self.axes_out[1].length(image_hw[1])
        full = self.kernel
        weight = self.weight() if self.kind in ("conv", "linear") else None
        bias = self.module.bias if weight is not None else None
        conv_strategy = strategy or (self.module.strategy if self.kind == "conv" else "auto")
        out = {}
        for key, groups in self.groups.items():
            acc = None
            for ih, iw, (h0, h1), (w0, w1) in groups:
                x = maps[ih, iw]
                top = self.axes_in[0].d * (h0 * self.dilation[0] - self.padding[0])
                left = self.axes_in[1].d * (w0 * self.dilation[1] - self.padding[1])
                height, width = lh + dh * (h1 - h0 - 1), lw + dw * (w1 - w0 - 1)
                if (top, left, height, width) != (0, 0) + tuple(x.shape[-2:]):
                    x = Window.apply(x, top, left, height, width)
                whole = (h0, h1, w0, w1) == (0, full[0], 0, full[1])
                if weight is not None:
                    w = weight if whole else weight[:, :, h0:h1, w0:w1]
                    y = F.conv2d(x, w, bias if len(groups) == 1 else None, 1, 0, (dh, dw),
                                 getattr(self.module, "groups", 1), conv_strategy)
                elif self.kind == "max":
                    y = _separable_pool(F.max_pool2d, x, h1 - h0, w1 - w0, dh, dw)
                else:
                    y = _separable_pool(F.avg_pool2d, x, h1 - h0, w1 - w0, dh, dw)
                    share = (h1 - h0) * (w1 - w0) / self.divisors[key]
                    y = y if share == 1.0 else y * share
                if acc is None:
                    acc = y
                elif self.kind == "max":
                    acc = Maximum.apply(acc, y)
                else:
                    acc = acc + y
            if weight is not None and bias is not None and len(groups) > 1:
                acc = acc + bias.reshape((1, bias.shape[0], 1, 1))
            out[key] = acc
        return out


def _separable_pool(pool, x, kh: int, kw: int, dh: int, dw: int):
    """A stride-1 kh×kw pooling as a 1×kw pass then a kh×1 pass: kh + kw taps per output instead of kh·kw.
    Exact for max (the same winner: the first maximum in row-major order, so gradients go to the same input)
    and for the mean of a full window (a mean of row means)."""
    if kh == 1 or kw == 1:
        return pool(x, (kh, kw), 1, 0, dilation=(dh, dw))
    return pool(pool(x, (1, kw), 1, 0, dilation=(1, dw)), (kh, 1), 1, 0, dilation=(dh, 1))


def _layers(module: Module, prefix: str = ""):
    if isinstance(module, L.Sequential):
        for name, child in module.named_layers():
            yield from _layers(child, f"{prefix}.{name}" if prefix else name)
    else:
        yield prefix or type(module).__name__, module


class DenseModel(Module):
    """The dense form of a patch classifier (built by :func:`convert`).

    Shape: (N, C, H, W) image -> (N, K, H, W) scores; pixel (i, j) holds the classifier's K scores for the
    patch around (i, j) (see the module docstring). Parameters are the original model's own tensors.
    ``strategy`` forces one conv2d strategy for every convolution (None: each Conv2d's own, "auto" for
    converted Linear layers).
    """

    def __init__(self, model: Module, patch_size, steps, in_channels, out_channels, strategy=None):
        super().__init__()
        for name, child in model.named_children():
            self._registry("_modules")[name] = child
        object.__setattr__(self, "steps", steps)
        object.__setattr__(self, "source", model)  # the patch classifier itself (not a second registration)
        self.patch_size = patch_size
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.strategy = strategy

    def forward(self, x, trace=None):
        """``trace(step_name, maps)`` (optional) is called after each step, e.g. to time layers."""
        from ..autograd.rules_dense import Window
        if isinstance(x, np.ndarray):
            x = Tensor.from_host(x)
        if not isinstance(x, Tensor):
            raise DTypeError(f"dense model: input must be a netcl Tensor, got {type(x).__name__}")
        if x.ndim != 4 or (self.in_channels is not None and x.shape[1] != self.in_channels):
            raise ShapeError(f"dense model expects an (N, {self.in_channels or 'C'}, H, W) image, got shape {x.shape}")
        nh, nw = self.patch_size
        hw = x.shape[2:]
        maps = {(0, 0): Window.apply(x, -(nh // 2), -(nw // 2), hw[0] + nh - 1, hw[1] + nw - 1)}
        if trace is not None:
            trace("pad", maps)
        for step in self.steps:
            if isinstance(step, Spatial):
                maps = step(maps, hw, self.strategy)
                name = step.name
            else:
                name, module = step
                maps = {key: module(t) for key, t in maps.items()}
            if trace is not None:
                trace(name, maps)
        (scores,) = maps.values()
        return scores

    def extra_repr(self):
        return f"patch_size={self.patch_size}, in_channels={self.in_channels}, out_channels={self.out_channels}"


def convert(model: Module, patch_size, strategy=None) -> DenseModel:
    """The dense model of a patch classifier (Algorithm 1 of Li, Zhao & Wang).

    ``model`` is a Sequential (possibly nested) of Conv2d, MaxPool2d, AvgPool2d, ReLU, Tanh, Flatten, Linear
    and Dropout that maps an (N, C, n_h, n_w) batch of patches to (N, K) or (N, K, 1, 1) scores;
    ``patch_size`` is n or (n_h, n_w). Dropout is dropped. Any other layer, or a geometry that does not end
    in one score vector per patch, raises nc.ShapeError naming the layer.
    """
    if not isinstance(model, Module):
        raise DTypeError(f"dense.convert takes a netcl Module, got {type(model).__name__}")
    if not isinstance(model, L.Sequential):
        raise ShapeError(f"dense.convert needs a Sequential patch classifier, got {type(model).__name__}")
    nh, nw = pair(patch_size, "dense.convert patch_size", 1)
    axes = (Axis(nh, (0,) * nh, 1), Axis(nw, (0,) * nw, 1))
    channels, in_channels, flat, steps = None, None, False, []
    for name, module in _layers(model):
        what = f"dense.convert: layer {name!r} ({type(module).__name__})"
        if isinstance(module, L.Conv2d):
            if flat:
                raise ShapeError(f"{what} comes after Flatten/Linear; only Linear layers can follow them")
            if channels is not None and channels != module.in_channels:
                raise ShapeError(f"{what} expects {module.in_channels} input channels, "
                                 f"the layer before gives {channels}")
            in_channels = module.in_channels if in_channels is None and channels is None else in_channels
            step = Spatial.make(name, module, "conv", module.kernel_size, module.stride, module.padding,
                                module.dilation, axes, module.in_channels)
            channels = module.out_channels
        elif isinstance(module, (L.MaxPool2d, L.AvgPool2d)):
            if flat:
                raise ShapeError(f"{what} comes after Flatten/Linear; only Linear layers can follow them")
            if module.ceil_mode or module.padding_end != module.padding:
                raise ShapeError(f"{what} uses ceil_mode or asymmetric padding, which a dense conversion cannot "
                                 "follow")
            kind = "max" if isinstance(module, L.MaxPool2d) else "avg"
            step = Spatial.make(name, module, kind, module.kernel_size, module.stride, module.padding,
                                module.dilation, axes, channels)
        elif isinstance(module, L.Linear):
            if not flat:
                raise ShapeError(f"{what} is applied to a 4-D feature map; put a Flatten before it")
            cells = axes[0].m * axes[1].m
            if channels is None:
                if module.in_features % cells:
                    raise PatchGeometryError(f"{what} has {module.in_features} input features, not a multiple of the "
                                     f"{axes[0].m}×{axes[1].m} feature map a patch has at this layer")
                channels = in_channels = module.in_features // cells
            if channels * cells != module.in_features:
                raise PatchGeometryError(f"{what} expects {module.in_features} input features, but a patch gives "
                                 f"{channels}×{axes[0].m}×{axes[1].m} = {channels * cells} at this layer")
            step = Spatial.make(name, module, "linear", (axes[0].m, axes[1].m), (1, 1), (0, 0), (1, 1), axes,
                                channels)
            channels = module.out_features
        elif isinstance(module, (L.ReLU, L.Tanh)):
            steps.append((name, module))
            continue
        elif isinstance(module, L.Dropout):
            continue
        elif isinstance(module, L.Flatten):
            if module.start_dim != 1:
                raise ShapeError(f"{what} flattens from dim {module.start_dim}; only start_dim=1 can be converted")
            flat = True
            continue
        else:
            raise ShapeError(f"{what} cannot be converted to a dense layer (convertible: Conv2d, MaxPool2d, "
                             "AvgPool2d, ReLU, Tanh, Flatten, Linear, Dropout)")
        steps.append(step)
        axes = step.axes_out
    if axes[0].m != 1 or axes[1].m != 1:
        raise PatchGeometryError(f"dense.convert: the model maps a {nh}×{nw} patch to a {axes[0].m}×{axes[1].m} map, "
                         "not to one score vector; check the patch size")
    if not any(isinstance(s, Spatial) for s in steps):
        raise ShapeError("dense.convert: the model has no Conv2d, pooling or Linear layer to convert")
    return DenseModel(model, (nh, nw), steps, in_channels, channels, strategy)


def infer_patch_size(model: Module, largest: int = 1024) -> tuple:
    """The smallest square patch n×n that ``model`` maps to one score vector (a ShapeError if none up to
    ``largest``). Several n may fit (floor division in strided layers); the smallest is the natural one."""
    last = None
    for n in range(1, largest + 1):
        try:
            convert(model, n)
            return (n, n)
        except PatchGeometryError as e:
            last = e
    raise ShapeError(f"no square patch up to {largest}×{largest} fits this model ({last})")
