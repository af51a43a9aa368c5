"""A weight's derivatives kept for inference: tensors a convolution strategy computes from its weight alone
(Winograd's transformed filters, MEC's rearranged weight, direct_blocked's packed weight), made once and
reused while the weight is unchanged.

In training the weights change at every step, so a derivative is made at each call and not kept (it would
only hold memory). In inference (netcl.ops.conv2d.run_pass passes ``keep``: no gradient will be asked of
the call, as in an eval forward or a replayed ``netcl.training.CapturedInference``) it is kept with the weight
tensor and made again, into the same storage, only when the weight's storage was written since
(``Tensor.version``: an optimizer step, load_state_dict, a BatchNorm refolded into it) or replaced. Inside
a recording the check is host work that a replay repeats (netcl.runtime.recording.refresh_call), so a
replay after such a write makes the derivative again before the recorded kernels read it.
"""
from __future__ import annotations

from typing import Callable

from ..runtime.recording import refresh_call
from ..tensor import Tensor


class KeptDerivative:
    """One derivative of one weight: ``make(weight, into)`` computes it (into ``into`` when given, a tensor
    it made before); ``current(weight)`` returns it, made again first when the weight changed."""

    __slots__ = ("make", "value", "source")

    def __init__(self, make: Callable[[Tensor, Tensor | None], Tensor]):
        self.make = make
        self.value: Tensor | None = None
        self.source: tuple = ()  # (buffer, offset, version) of the weight it was made from

    def current(self, weight: Tensor) -> Tensor:
        source = self.source
        if (self.value is None or source[0] is not weight.buffer or source[1] != weight.offset
                or source[2] != weight.version):
            # the version is read before the work is enqueued: a write counted later comes after it
            self.source = (weight.buffer, weight.offset, weight.version)
            self.value = self.make(weight, self.value)
        return self.value


def derived_from_weight(weight: Tensor, key: tuple, make: Callable[[Tensor, Tensor | None], Tensor],
                        keep: bool) -> Tensor:
    """``make(weight, None)`` unless ``keep``; with ``keep`` (inference) the derivative kept with ``weight``
    under ``key`` (which must name everything ``make`` depends on besides the weight's values: the layer's
    shape, the strategy, the variant), made again only when the weight changed (see the module docstring)."""
    if not keep:
        return make(weight, None)
    kept = weight.__dict__.get("_kept_derivatives")
    if kept is None:
        kept = weight.__dict__["_kept_derivatives"] = {}
    entry = kept.get(key)
    if entry is None:
        entry = kept[key] = KeptDerivative(make)
    return refresh_call(weight.device, entry.current, weight)
