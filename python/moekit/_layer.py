"""MoeLayer, Checkpoint and Router: the C++ objects with torch or numpy outputs.

Inputs are read in place through DLPack (torch, numpy, cupy, anything with __dlpack__); the
outputs are allocated by the framework of the input (torch in, torch out; numpy in, numpy out)
unless `out=` is given, which is written in place. On a GPU the layer runs on torch's current
stream and returns without waiting, as any torch operation does.
"""

import itertools
import os
import sys
import weakref

import numpy as np

from . import _moekit

_handles = itertools.count(1)
_layers = weakref.WeakValueDictionary()


def _torch():
    return sys.modules.get("torch")


def _is_torch(x):
    torch = _torch()
    return torch is not None and isinstance(x, torch.Tensor)


def _readable(x):
    """A torch tensor as DLPack exports it: detached (no copy) and float8 as its bytes."""
    if _is_torch(x):
        torch = _torch()
        x = x.detach()
        if x.dtype == getattr(torch, "float8_e4m3fn", None):
            x = x.view(torch.uint8)
    return x


def _host_weight(x):
    """Weights are read on the host when the layer is built (it copies what it keeps, on its
    own device); a torch tensor on a GPU is brought over once."""
    x = _readable(x)
    if _is_torch(x) and x.device.type != "cpu":
        x = x.cpu()
    return x


def layer_of(handle):
    """The MoeLayer registered under `handle` (MoeLayer.handle), for torch.ops.moekit.moe."""
    layer = _layers.get(handle)
    if layer is None:
        raise ValueError(f"layer: no live moekit.MoeLayer has handle {handle}")
    return layer


def _rows(x, width, name):
    """[..., width] -> [T, width] without a copy; anything else is left for moekit's checks to
    name."""
    if not (_is_torch(x) or isinstance(x, np.ndarray)):
        _moekit._view(x, name)  # TypeError for what is no tensor at all
        return x, None
    shape = tuple(x.shape)
    if len(shape) > 2 and shape[-1] == width:
        contiguous = x.is_contiguous() if _is_torch(x) else getattr(x, "flags", None) is not None and x.flags.c_contiguous
        if contiguous:
            return x.reshape(-1, width), shape
    return x, shape


class MoeLayer:
    """One MoE layer, built from a Plan and the model's weights.

    `weights` is a dict of tensors by the C++ names: w13 [E, 2I, H] (gate rows then up rows), w2
    [E, H, I], their scales and zero points for quantised formats (w13_scale, w13_zero,
    w13_input_scale, ...), correction_bias [E], shared_w13, shared_w2 (and their scales),
    shared_gate [1, H]. Float weights are quantised into the plan's format at load time;
    quantised ones come as their bytes (e4m3 as uint8 or torch.float8_e4m3fn, int4 as uint8 with
    two values per byte along the last axis). The layer copies what it keeps once, reading the
    caller's tensors in place; they may be freed afterwards.
    """

    def __init__(self, plan, weights):
        if isinstance(plan, _moekit._Layer):  # from Checkpoint.load
            self._layer = plan
        else:
            if not isinstance(plan, _moekit.Plan):
                raise TypeError(f"plan: expected a moekit.Plan (moekit.resolve), got {type(plan).__name__}")
            if not isinstance(weights, dict):
                raise TypeError(f"weights: expected a dict of tensors by name, got {type(weights).__name__}")
            self._layer = _moekit._Layer.from_weights(plan, {k: _host_weight(v) for k, v in weights.items()})
        self.plan = self._layer.plan
        self.handle = next(_handles)
        _layers[self.handle] = self

    @property
    def hidden(self):
        return self.plan.spec.hidden

    @property
    def top_k(self):
        return self.plan.spec.routing.top_k

    def __call__(self, hidden_states, router_logits, out=None, return_routing=False):
        return self.forward(hidden_states, router_logits, out=out, return_routing=return_routing)

    def forward(self, hidden_states, router_logits, out=None, return_routing=False):
        """The layer's output for `hidden_states` [T, H] (or [..., H]) and `router_logits`
        [T, E]: f32, bf16 or f16, on the plan's device. Returns the output (hidden's dtype and
        shape), or (output, topk_ids int32 [T, k], topk_weights f32 [T, k]) with
        return_routing."""
        spec = self.plan.spec
        hidden, shape = _rows(_readable(hidden_states), spec.hidden, "hidden_states")
        logits, _ = _rows(_readable(router_logits), spec.n_experts, "router_logits")
        given = out
        if out is not None:
            out, _ = _rows(out, spec.hidden, "output")
        ids = weights = None
        stream = None
        rows = (hidden.shape[0] if getattr(hidden, "ndim", 0) else 0, spec.routing.top_k)
        if _is_torch(hidden):
            torch = _torch()
            if out is None:
                out = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device)
            if return_routing:
                ids = torch.empty(rows, dtype=torch.int32, device=hidden.device)
                weights = torch.empty(rows, dtype=torch.float32, device=hidden.device)
            if hidden.device.type == "cuda":
                stream = torch.cuda.current_stream(hidden.device).cuda_stream
        elif isinstance(hidden, np.ndarray):
            if out is None:
                out = np.empty(hidden.shape, dtype=hidden.dtype)
            if return_routing:
                ids = np.empty(rows, dtype=np.int32)
                weights = np.empty(rows, dtype=np.float32)
        elif out is None or return_routing:
            raise TypeError(
                f"hidden_states: a {type(hidden).__name__} is neither a torch tensor nor a numpy "
                "array; pass out= (and no return_routing) to have moekit write into your own"
            )
        self._layer.forward(hidden, logits, out, ids, weights, stream)
        result = given if given is not None else out.reshape(shape) if shape else out
        if return_routing:
            return result, ids, weights
        return result

    def synchronize(self):
        """Waits for the work a GPU forward enqueued; raises ValueError, naming the tensor, row
        and column, for a NaN or Inf input the device's checks found since the last call."""
        self._layer.synchronize()

    def explain(self):
        return self.plan.explain()

    def __repr__(self):
        return f"MoeLayer({self.plan!r}, handle={self.handle})"


class Router:
    """A checkpoint layer's router: logits [T, E] float32 = hidden @ weight.T."""

    def __init__(self, gate, experts):
        self._gate = gate
        self._experts = experts

    def logits(self, hidden_states, out=None):
        hidden = _readable(hidden_states)
        rows = (hidden.shape[0] if getattr(hidden, "ndim", 0) else 0, self._experts)
        if out is not None and tuple(getattr(out, "shape", ())) != rows:
            raise ValueError(f"router_logits: expected shape {list(rows)}, got {list(getattr(out, 'shape', ()))}")
        if out is None:
            if _is_torch(hidden):
                out = _torch().empty(rows, dtype=_torch().float32, device=hidden.device)
            else:
                out = np.empty(rows, dtype=np.float32)
        self._gate._logits(hidden, out)
        return out

    __call__ = logits


class Checkpoint:
    """A Hugging Face model directory opened for its MoE layers (docs/CHECKPOINTS.md)."""

    def __init__(self, checkpoint):
        self._checkpoint = checkpoint

    @staticmethod
    def open(path):
        return Checkpoint(_moekit.Checkpoint.open(os.fspath(path)))

    directory = property(lambda self: self._checkpoint.directory)
    family = property(lambda self: self._checkpoint.family)
    num_layers = property(lambda self: self._checkpoint.num_layers)
    moe_layers = property(lambda self: self._checkpoint.moe_layers)

    def spec(self, layer):
        return self._checkpoint.spec(layer)

    def stored_format(self, layer):
        return self._checkpoint.stored_format(layer)

    def format_for(self, layer, requested=None):
        if isinstance(requested, str):
            requested = _moekit.QuantParams(requested)
        return self._checkpoint.format_for(layer, requested)

    def load(self, layer, plan):
        """The MoeLayer of `plan` (made for spec(layer)) with this rank's experts read from
        disk."""
        return MoeLayer(self._checkpoint._load(layer, plan), None)

    def router(self, layer):
        return Router(self._checkpoint.router(layer), self._checkpoint.spec(layer).n_experts)
