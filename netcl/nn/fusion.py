"""Layer fusion: ONE table of patterns of consecutive steps -> one fused functional call.

``run(steps, x)`` applies a chain of steps (modules, or ``Residual(shortcut)`` for a residual add) to x;
at each position the first table entry whose pattern matches the next steps, and whose condition holds
(train/eval), runs them as one call. Sequential.forward and ResNet's BasicBlock both go through it, so
LeNet's ReLU + max-pool and the ResNet's BN + ReLU and residual add + ReLU share one mechanism.

Every fused call computes what the unfused steps compute (up to float rounding), gradients included:
  Conv2d, BatchNorm2d [, Residual], ReLU     inference (eval and no_grad): BN folded into the convolution's
                                            weights and bias (FoldedConvBN, kept with the BatchNorm and
                                            folded anew only when what it comes from changed), then
                                            netcl.ops.conv2d.conv2d_inference: the epilogue bias
                                            [+ shortcut] [relu] fused into the convolution's store where
                                            its strategy can, else one pass after it
  Conv2d, BatchNorm2d, Residual            inference: the same with the shortcut and no activation
                                            (MobileNetV2's linear bottleneck plus its input)
  Conv2d, BatchNorm2d, ReLU6               inference: the same with ReLU6 (MobileNetV2's Conv-BN-ReLU6)
  Conv2d, BatchNorm2d, Hardswish           inference: the same with Hardswish (MobileNetV3's)
  Conv2d, BatchNorm2d                       inference: the same without the ReLU
  Conv2d [, Residual] [, ReLU or ReLU6]     inference, a convolution with a bias (a graph whose exporter
                                            folded BatchNorm away): bias [+ shortcut] [activation] as
                                            the convolution's epilogue, as above
  BatchNorm, Residual, ReLU                 relu(bn(x) + shortcut): one apply kernel (backward: two)
  BatchNorm, ReLU                           relu(bn(x)): one apply kernel
  BatchNorm, ReLU6                          relu6(bn(x)): one apply kernel
  Residual, ReLU                            relu(x + shortcut): one kernel (F.add_relu)
  ReLU, MaxPool2d                           max_pool2d(relu(x)): one pooling kernel
Only exact types match (a subclass may override forward), and a module called on its own is unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Callable, Sequence

from ..autograd import is_grad_enabled
from ..ops.batchnorm import fold_into_conv
from ..ops.conv2d import conv2d_inference
from ..runtime.recording import refresh_call
from ..tensor import Tensor
from . import functional as F
from .activation import Hardswish, ReLU, ReLU6
from .layers import Conv2d, MaxPool2d
from .normalization import BatchNorm1d, BatchNorm2d


class Residual:
    """A chain step adding ``shortcut`` to the running value (a residual connection)."""

    def __init__(self, shortcut):
        self.shortcut = shortcut

    def __call__(self, x):
        return x + self.shortcut


@dataclass(frozen=True)
class Fusion:
    name: str
    pattern: tuple[tuple[type, ...], ...]     # allowed exact types per position
    applies: Callable[[Sequence], bool]       # a condition on the matched steps (e.g. eval mode)
    run: Callable[[Sequence, object], object]  # (matched steps, x) -> output

    def matches(self, steps: Sequence) -> bool:
        return (len(steps) >= len(self.pattern)
                and all(type(s) in allowed for s, allowed in zip(steps, self.pattern))
                and self.applies(steps[:len(self.pattern)]))


_BN = (BatchNorm1d, BatchNorm2d)


def _foldable(steps) -> bool:
    """Inference only (no graph is recorded): with gradients wanted, eval BN stays its own fused kernel."""
    conv, bn = steps[0], steps[1]
    return (not is_grad_enabled() and not bn.uses_batch_stats() and bn.num_features == conv.out_channels
            and conv.weight.dtype == bn.running_mean.dtype)


class FoldedConvBN:
    """A convolution's weight and bias with the eval-mode BatchNorm after it folded in, kept with that
    BatchNorm (its ``folded_conv``). ``current(conv, bn)`` folds again (one launch) only when one of the
    six tensors it comes from (the convolution's weight and bias, the running statistics, the affine
    weight and bias) was written in place since (``Tensor.version``: an optimizer step, load_state_dict,
    a training forward's running statistics, a replayed training step) or replaced, or ``eps`` changed;
    it refolds into the same two tensors whenever their shapes allow, so a recorded forward that reads
    them stays right. A recorded forward (netcl.training.CapturedInference) calls ``current`` as host work
    at every replay after which a parameter or buffer was written (netcl.runtime.recording.refresh_call)."""

    def __init__(self):
        self.weight: Tensor | None = None
        self.bias: Tensor | None = None
        self._folded_from: tuple = ()  # (tensor, its buffer, its version) for each source, then eps

    def current(self, conv, bn) -> tuple[Tensor, Tensor]:
        """The folded (weight, bias), folded anew first if a source changed."""
        # read from the registries: a replay calls this for every folded pair (Module.__getattr__ costs more)
        params, affine, stats = conv._parameters, bn._parameters, bn._buffers
        sources = (params["weight"], params.get("bias"), stats["running_mean"], stats["running_var"],
                   affine.get("weight"), affine.get("bias"))
        if not self._unchanged(sources, bn.eps):
            self._fold(sources, bn.eps)
        return self.weight, self.bias

    def _unchanged(self, sources, eps) -> bool:
        seen = self._folded_from
        if not seen or seen[-1] != eps:
            return False
        for t, (was, buffer, version) in zip(sources, seen):
            if t is not was or (t is not None and (t.buffer is not buffer or t.version != version)):
                return False
        return True

    def _fold(self, sources, eps) -> None:
        conv_weight = sources[0]
        # The versions are read before the fold is enqueued: a write counted later comes after it.
        seen = tuple((t, None if t is None else t.buffer, None if t is None else t.version) for t in sources)
        out = None
        if (self.weight is not None and self.weight.shape == conv_weight.shape
                and self.weight.dtype == conv_weight.dtype and self.weight.device is conv_weight.device):
            out = (self.weight, self.bias)
        self.weight, self.bias = fold_into_conv(*sources, eps, out=out)
        self._folded_from = seen + (eps,)


def _folded(steps, x, residual=None, activation: str | None = None):
    """conv with bn folded into its weights (kept: see FoldedConvBN), its epilogue bias [+ residual]
    [activation] fused into the convolution where its strategy can, else one pass after it."""
    conv, bn = steps[0], steps[1]
    fold = bn.folded_conv
    if fold is None:
        fold = bn.folded_conv = FoldedConvBN()
    weight, bias = refresh_call(conv.weight.device, fold.current, conv, bn)
    return conv2d_inference(x, weight, bias, conv.stride, conv.padding, conv.dilation, conv.groups,
                            conv.strategy, residual=residual, activation=activation)


def _biased_inference(steps) -> bool:
    """Inference (no graph is recorded) through a convolution with a bias: the bias goes into the pass that
    adds the shortcut or applies the activation (an imported graph whose exporter folded BatchNorm away)."""
    return not is_grad_enabled() and steps[0].bias is not None


def _conv_epilogue(steps, x, residual=None, activation: str | None = None):
    """conv with its epilogue bias [+ residual] [activation] fused where its strategy can, else one pass
    after it."""
    conv = steps[0]
    return conv2d_inference(x, conv.weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups,
                            conv.strategy, residual=residual, activation=activation)


def _always(steps) -> bool:
    return True


FUSIONS: tuple[Fusion, ...] = (
    Fusion("conv+bn+residual+relu (eval: folded)", ((Conv2d,), (BatchNorm2d,), (Residual,), (ReLU,)), _foldable,
           lambda s, x: _folded(s, x, s[2].shortcut, activation="relu")),
    Fusion("conv+bn+residual (eval: folded)", ((Conv2d,), (BatchNorm2d,), (Residual,)), _foldable,
           lambda s, x: _folded(s, x, s[2].shortcut)),
    Fusion("conv+bn+relu (eval: folded)", ((Conv2d,), (BatchNorm2d,), (ReLU,)), _foldable,
           lambda s, x: _folded(s, x, activation="relu")),
    Fusion("conv+bn+relu6 (eval: folded)", ((Conv2d,), (BatchNorm2d,), (ReLU6,)), _foldable,
           lambda s, x: _folded(s, x, activation="relu6")),
    Fusion("conv+bn+hardswish (eval: folded)", ((Conv2d,), (BatchNorm2d,), (Hardswish,)), _foldable,
           lambda s, x: _folded(s, x, activation="hardswish")),
    Fusion("conv+bn (eval: folded)", ((Conv2d,), (BatchNorm2d,)), _foldable,
           lambda s, x: _folded(s, x)),
    Fusion("conv+residual+relu (inference)", ((Conv2d,), (Residual,), (ReLU,)), _biased_inference,
           lambda s, x: _conv_epilogue(s, x, s[1].shortcut, activation="relu")),
    Fusion("conv+residual (inference)", ((Conv2d,), (Residual,)), _biased_inference,
           lambda s, x: _conv_epilogue(s, x, s[1].shortcut)),
    Fusion("conv+relu (inference)", ((Conv2d,), (ReLU,)), _biased_inference,
           lambda s, x: _conv_epilogue(s, x, activation="relu")),
    Fusion("conv+relu6 (inference)", ((Conv2d,), (ReLU6,)), _biased_inference,
           lambda s, x: _conv_epilogue(s, x, activation="relu6")),
    Fusion("bn+residual+relu", (_BN, (Residual,), (ReLU,)), _always,
           lambda s, x: s[0](x, relu=True, residual=s[1].shortcut)),
    Fusion("bn+relu", (_BN, (ReLU,)), _always, lambda s, x: s[0](x, relu=True)),
    Fusion("bn+relu6", (_BN, (ReLU6,)), _always, lambda s, x: s[0](x, relu6=True)),
    Fusion("residual+relu", ((Residual,), (ReLU,)), _always, lambda s, x: F.add_relu(x, s[0].shortcut)),
    Fusion("relu+maxpool", ((ReLU,), (MaxPool2d,)), _always, lambda s, x: s[1](x, fused_relu=True)),
)


def _by_first_step(fusions: Sequence[Fusion]) -> MappingProxyType:
    """Step type -> the fusions whose pattern starts with it, in table order."""
    kinds = dict.fromkeys(kind for f in fusions for kind in f.pattern[0])
    return MappingProxyType({kind: tuple(f for f in fusions if kind in f.pattern[0]) for kind in kinds})


# Most steps start no pattern: looking the candidates up by the step's type keeps a forward pass from
# testing every pattern at every step.
STARTING_WITH = _by_first_step(FUSIONS)


def _fusion_at(steps: Sequence, k: int) -> Fusion | None:
    """The first FUSIONS entry that covers steps[k:], if any."""
    candidates = STARTING_WITH.get(type(steps[k]), ())
    if not candidates:
        return None
    rest = steps[k:]
    return next((f for f in candidates if f.matches(rest)), None)


def plan(steps: Sequence) -> list[tuple[str | None, Sequence]]:
    """How ``run`` groups the steps: (fusion name or None, steps) in order (for tests and explanations)."""
    groups, k = [], 0
    while k < len(steps):
        fusion = _fusion_at(steps, k)
        width = len(fusion.pattern) if fusion else 1
        groups.append((fusion.name if fusion else None, steps[k:k + width]))
        k += width
    return groups


def run(steps: Sequence, x):
    """Apply the chain of steps to x, fusing every run of steps that a FUSIONS entry covers."""
    k = 0
    while k < len(steps):
        fusion = _fusion_at(steps, k)
        if fusion is None:
            x = steps[k](x)
            k += 1
        else:
            x = fusion.run(steps[k:k + len(fusion.pattern)], x)
            k += len(fusion.pattern)
    return x
