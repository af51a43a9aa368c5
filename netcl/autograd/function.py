"""The autograd engine: Function.apply records a node; Tensor.backward walks the nodes in reverse.

A Function subclass has ``forward(ctx, *args)`` returning a Tensor (or a tuple of them) and
``backward(ctx, *grad_outputs)`` returning one gradient (or None) per positional argument of forward.
Forward runs with recording off, so ops inside a rule never build graph of their own.
"""
from __future__ import annotations

import contextlib
import threading

from ..runtime import recording

_state = threading.local()


def is_grad_enabled() -> bool:
    return getattr(_state, "enabled", True)


class _GradMode:
    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        self.previous = is_grad_enabled()
        _state.enabled = self.enabled

    def __exit__(self, *exc):
        _state.enabled = self.previous

    def __call__(self, fn):
        import functools

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with _GradMode(self.enabled):
                return fn(*args, **kwargs)
        return wrapper


def no_grad():
    """Context manager (and decorator): operations inside record no graph."""
    return _GradMode(False)


def enable_grad():
    return _GradMode(True)


class Context:
    """What a rule keeps from forward for backward."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


class Node:
    """One recorded application of a Function. ``inputs`` keeps, per positional argument, where its
    gradient goes: the leaf tensor itself, an ``Edge`` to the node that made it, or None (not a tensor,
    or one that needs no gradient). It keeps no computed tensor alive: only ``ctx`` holds what backward
    needs, and backward drops ``ctx`` once it has used it, so activations are freed after their last use."""

    __slots__ = ("function", "ctx", "inputs", "n_outputs", "__weakref__")

    def __init__(self, function, ctx, inputs, n_outputs):
        self.function = function
        self.ctx = ctx
        self.inputs = inputs
        self.n_outputs = n_outputs


class Edge:
    """Where the gradient of a computed (non-leaf) input goes: output ``_grad_slot`` of ``_grad_node``;
    ``shape`` checks the gradient delivered. It stands in for the tensor, which is not kept."""

    __slots__ = ("_grad_node", "_grad_slot", "shape")
    requires_grad = True

    def __init__(self, tensor):
        self._grad_node, self._grad_slot, self.shape = tensor._grad_node, tensor._grad_slot, tensor.shape


def _gradient_target(arg, tensor_type):
    if not isinstance(arg, tensor_type) or not arg.requires_grad:
        return None
    return arg if arg._grad_node is None else Edge(arg)


def _unlink_saved_outputs(ctx, outs) -> None:
    """Replace the outputs a rule saved on ``ctx`` (directly or in a tuple) by detached views of the same
    storage: an output holding its node, which holds the output, would be a reference cycle that only
    the cyclic garbage collector frees, at a moment of its own choosing long after the step."""
    for name, value in vars(ctx).items():
        replaced = _unlinked(value, outs)
        if isinstance(value, tuple):
            replaced = tuple(_unlinked(v, outs) for v in value)
            if all(a is b for a, b in zip(replaced, value)):
                continue
        elif replaced is value:
            continue
        setattr(ctx, name, replaced)


def _unlinked(value, outs):
    return value.detach() if any(value is out for out in outs if out is not None) else value


class Function:
    """Subclasses define the static methods ``forward(ctx, ...)`` and ``backward(ctx, *grads)``."""

    @classmethod
    def apply(cls, *args, **kwargs):
        from ..tensor import Tensor

        ctx = Context()
        ctx.needs_input_grad = tuple(isinstance(a, Tensor) and a.requires_grad for a in args)
        # whether backward can ever run: forward may skip what only backward reads (max pooling's argmax)
        ctx.records_graph = is_grad_enabled() and any(ctx.needs_input_grad)
        with _GradMode(False):
            outputs = cls.forward(ctx, *args, **kwargs)
        if ctx.records_graph:
            outs = outputs if isinstance(outputs, tuple) else (outputs,)
            _unlink_saved_outputs(ctx, outs)
            node = Node(cls, ctx, tuple(_gradient_target(a, Tensor) for a in args), len(outs))
            for k, out in enumerate(outs):
                if out is not None and out.dtype.kind == "f":
                    out._grad_node = node
                    out._grad_slot = k
                    out.requires_grad = True
        return outputs


class _HookHandle:
    def __init__(self, hooks: list, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        global _leaf_hook_count
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)
            _leaf_hook_count -= 1


_leaf_hook_count = 0  # while 0, backward() counts no contributions (no cost without hooks)


def register_post_accumulate_grad_hook(tensor, hook) -> _HookHandle:
    """Call ``hook(tensor)`` once per backward pass through a leaf ``tensor``, after the pass has
    accumulated into ``tensor.grad`` every gradient it delivers there (torch's hook of the same name);
    data-parallel training starts a bucket's allreduce from it. Returns a handle with ``remove()``."""
    global _leaf_hook_count
    hooks = tensor.__dict__.setdefault("_post_accumulate_grad_hooks", [])
    hooks.append(hook)
    _leaf_hook_count += 1
    return _HookHandle(hooks, hook)


def queue_backward_callback(callback) -> None:
    """Run ``callback()`` when the backward pass now running ends (after every leaf's hooks), once; a
    pass that raises drops its callbacks. Only valid inside a backward pass (from a hook or a rule)."""
    queued = getattr(_state, "backward_callbacks", None)
    if queued is None:
        raise RuntimeError("queue_backward_callback() called outside a backward pass")
    queued.append(callback)


def _run_leaf_hooks(t) -> None:
    # A replayed step (netcl.training.replay) calls the hooks again where this pass called them.
    for hook in list(t.__dict__.get("_post_accumulate_grad_hooks", ())):
        recording.host_call(t.device, hook, t)


def _open_callbacks() -> None:
    _state.__dict__.setdefault("outer_callbacks", []).append(getattr(_state, "backward_callbacks", None))
    _state.backward_callbacks = []


def _close_callbacks(device, run: bool = True) -> None:
    try:
        if run:
            with recording.not_recorded(device):
                while _state.backward_callbacks:  # a callback may queue another
                    _state.backward_callbacks.pop(0)()
    finally:
        _state.backward_callbacks = _state.outer_callbacks.pop()


@contextlib.contextmanager
def backward_callbacks_scope(device):
    """A backward pass's scope for ``queue_backward_callback``: the callbacks queued within run when it
    ends without an error. Inside a recording, its opening and its end are recorded as host work, so a
    replay runs the callbacks that the replayed hooks queue where the pass ended (the callbacks' own
    commands are not recorded)."""
    being_made = recording.active(device)
    _open_callbacks()
    if being_made is not None:
        being_made.host(_open_callbacks, (), {})
    finished = False
    try:
        yield
        finished = True
    finally:
        _close_callbacks(device, run=finished)
    if being_made is not None:
        being_made.host(_close_callbacks, (device,), {})


def backward(root, gradient, retain_graph: bool = False) -> None:
    """Accumulate d(root)/d(leaf) into every leaf's ``.grad``; then run the callbacks queued meanwhile.
    Each node's saved tensors are dropped once its backward has run, unless ``retain_graph``."""
    with backward_callbacks_scope(root.device):
        _backward(root, gradient, retain_graph)


def _backward(root, gradient, retain_graph: bool = False) -> None:
    order, seen = [], set()
    stack = [(root._grad_node, False)] if root._grad_node is not None else []
    while stack:  # iterative post-order DFS: deep graphs must not hit the recursion limit
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for t in node.inputs:
            if t is not None and t._grad_node is not None and id(t._grad_node) not in seen:
                stack.append((t._grad_node, False))

    grads: dict[int, list] = {id(root._grad_node): [None] * root._grad_node.n_outputs} if root._grad_node else {}
    if root._grad_node is None:
        _accumulate_leaf(root, gradient)
        if _leaf_hook_count:
            _run_leaf_hooks(root)
        return
    # With leaf hooks registered: how many node inputs of this pass are each hooked leaf, so that its
    # hooks run once, after the last of them has delivered (a weight used twice gets two gradients).
    pending: dict[int, int] = {}
    if _leaf_hook_count:
        for node in order:
            for t in node.inputs:
                if t is not None and t._grad_node is None and "_post_accumulate_grad_hooks" in t.__dict__:
                    pending[id(t)] = pending.get(id(t), 0) + 1
    grads[id(root._grad_node)][root._grad_slot] = gradient
    with _GradMode(False):
        for node in reversed(order):
            outs = grads.pop(id(node), None)
            if outs is None or all(g is None for g in outs):
                if pending:
                    _settle_leaves(node, pending)
                continue
            ctx = node.ctx
            if ctx is None:
                raise RuntimeError(f"backward through {node.function.__name__} a second time: its saved tensors "
                                   f"were freed by the first backward (pass retain_graph=True to the first)")
            if not retain_graph:
                node.ctx = None
            in_grads = node.function.backward(ctx, *outs)
            del ctx
            if not isinstance(in_grads, tuple):
                in_grads = (in_grads,)
            for t, g in zip(node.inputs, in_grads):
                if t is None or g is None or not t.requires_grad:
                    continue
                if g.shape != t.shape:
                    raise RuntimeError(f"internal: {node.function.__name__}.backward gave a gradient of shape "
                                       f"{g.shape} for an input of shape {t.shape}")
                if t._grad_node is None:
                    _accumulate_leaf(t, g)
                else:
                    slots = grads.setdefault(id(t._grad_node), [None] * t._grad_node.n_outputs)
                    prev = slots[t._grad_slot]
                    slots[t._grad_slot] = g if prev is None else prev + g
            if pending:
                _settle_leaves(node, pending)


def _settle_leaves(node, pending: dict) -> None:
    """Count ``node``'s deliveries to hooked leaves; run a leaf's hooks after its last one."""
    for t in node.inputs:
        if t is not None and id(t) in pending:
            pending[id(t)] -= 1
            if pending[id(t)] == 0:
                del pending[id(t)]
                _run_leaf_hooks(t)


def _accumulate_leaf(t, g) -> None:
    if g.dtype != t.dtype:
        g = g.astype(t.dtype)
    t.grad = g.detach() if t.grad is None else (t.grad + g).detach()
