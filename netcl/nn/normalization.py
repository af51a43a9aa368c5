"""BatchNorm1d and BatchNorm2d with PyTorch's semantics, buffers and state_dict keys.

Training normalizes by the batch's statistics (biased variance) and moves ``running_mean`` /
``running_var`` (unbiased variance) by ``momentum``, or by the cumulative average when momentum is None;
``num_batches_tracked`` (int64) counts the batches. Eval normalizes by the running statistics, unless
``track_running_stats=False``, which always uses the batch's own. Statistics, normalization and the
running update are two kernel launches (netcl.ops.batchnorm); a following ReLU or residual add fuses
into the second (netcl.nn.fusion).
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import dtypes
from ..errors import ShapeError
from ..tensor import Tensor
from . import functional as F
from ..module import Module


class _BatchNorm(Module):
    input_ranks: tuple[int, ...] = ()

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True, device=None,
                 dtype=np.float32):
        super().__init__()
        owner = type(self).__name__
        if not isinstance(num_features, numbers.Integral) or isinstance(num_features, bool) or num_features <= 0:
            raise ShapeError(f"{owner} num_features must be a positive int, got {num_features!r}")
        if momentum is not None and (not isinstance(momentum, numbers.Real) or not 0.0 <= momentum <= 1.0):
            raise ShapeError(f"{owner} momentum must be in [0, 1] or None, got {momentum!r}")
        if not isinstance(eps, numbers.Real) or eps < 0:
            raise ShapeError(f"{owner} eps must be a non-negative number, got {eps!r}")
        self.num_features = int(num_features)
        self.eps = float(eps)
        self.momentum = None if momentum is None else float(momentum)
        self.affine = bool(affine)
        self.track_running_stats = bool(track_running_stats)
        dt = dtypes.as_dtype(dtype)
        c = self.num_features
        if self.affine:
            self.weight = Tensor.from_host(np.ones(c, dt), device, requires_grad=True)
            self.bias = Tensor.from_host(np.zeros(c, dt), device, requires_grad=True)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if self.track_running_stats:
            self.register_buffer("running_mean", Tensor.from_host(np.zeros(c, dt), device))
            self.register_buffer("running_var", Tensor.from_host(np.ones(c, dt), device))
            self.register_buffer("num_batches_tracked", Tensor.from_host(np.zeros((), np.int64), device))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        # This layer folded into the convolution before it for inference (netcl.nn.fusion.FoldedConvBN),
        # kept while the tensors it was folded from are unchanged.
        self.folded_conv = None

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            from ..ops.elementwise import fill
            fill(self.running_mean, 0)
            fill(self.running_var, 1)
            fill(self.num_batches_tracked, 0)

    def _check_input(self, x) -> None:
        if not isinstance(x, Tensor):
            raise ShapeError(f"{type(self).__name__}: input must be a netcl Tensor, got {type(x).__name__}")
        if x.ndim not in self.input_ranks:
            ranks = " or ".join(f"{r}D" for r in self.input_ranks)
            raise ShapeError(f"{type(self).__name__}: expected {ranks} input, got input of shape {x.shape}")
        if x.shape[1] != self.num_features:
            raise ShapeError(f"{type(self).__name__}({self.num_features}): input of shape {x.shape} has "
                             f"{x.shape[1]} channels")

    @property
    def eps(self) -> float:
        return self._eps

    @eps.setter
    def eps(self, value) -> None:
        # What was derived from the statistics with the old eps (this layer folded into a convolution) is
        # made again when a tensor it was derived from is written: a new eps counts as a write of the
        # running variance it is added to.
        self._eps = float(value)
        running_var = self.__dict__.get("_buffers", {}).get("running_var")
        if running_var is not None:
            running_var.mark_written()

    def uses_batch_stats(self) -> bool:
        return self.training or not self.track_running_stats

    def forward(self, x, relu: bool = False, residual=None, relu6: bool = False):
        """``relu`` and ``residual`` (netcl's fusion hooks): relu(bn(x) + residual) in the same kernel;
        ``relu6``: ReLU6 in place of the ReLU."""
        self._check_input(x)
        update = self.training and self.track_running_stats
        if self.training:  # the kept fold is a second copy of the convolution's weights: not kept in training
            self.folded_conv = None
        return F.batch_norm(x, self.running_mean if update or not self.training else None,
                            self.running_var if update or not self.training else None, self.weight, self.bias,
                            self.uses_batch_stats(), self.momentum, self.eps,
                            num_batches_tracked=self.num_batches_tracked if update else None, relu=relu,
                            residual=residual, relu6=relu6)

    def extra_repr(self):
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) inputs over N (and L)."""

    input_ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) inputs over N, H and W (per channel)."""

    input_ranks = (4,)
