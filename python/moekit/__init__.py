"""moekit: the Mixture-of-Experts layer of LLMs, planned then run.

    spec = moekit.ModelSpec.preset("qwen3-moe")
    plan = moekit.resolve(spec, moekit.Options(weights=moekit.Fp8Block(128), max_tokens=256))
    print(plan.explain())
    layer = moekit.MoeLayer(plan, {"w13": w13, "w2": w2})   # torch, numpy, any __dlpack__
    out = layer(hidden_states, router_logits)               # torch in, torch out

Errors carry the C++ message: a refused configuration raises ConfigRefused (a ValueError), bad
input ValueError or TypeError, an allocation that fails MemoryError.
"""

from . import _moekit
from ._moekit import (
    Activation,
    ConfigRefused,
    Decision,
    Fp8Block,
    Fp8Tensor,
    Int4Group,
    Int4GroupA8,
    ModelSpec,
    Options,
    Plan,
    Platform,
    QuantParams,
    Rejected,
    RoutingSpec,
    Unquantized,
    quantize_matrices,
    resolve,
)
from ._layer import Checkpoint, MoeLayer, Router
from ._spec import from_hf_config as _from_hf_config

__version__ = _moekit.__version__

ModelSpec.from_hf_config = staticmethod(_from_hf_config)

try:
    from . import _torch_op as _torch_op  # registers torch.ops.moekit.moe where torch exists
except ImportError:  # no torch: numpy (and any __dlpack__ tensor with out=) only
    _torch_op = None

__all__ = [
    "Activation",
    "Checkpoint",
    "ConfigRefused",
    "Decision",
    "Fp8Block",
    "Fp8Tensor",
    "Int4Group",
    "Int4GroupA8",
    "ModelSpec",
    "MoeLayer",
    "Options",
    "Plan",
    "Platform",
    "QuantParams",
    "Rejected",
    "Router",
    "RoutingSpec",
    "Unquantized",
    "quantize_matrices",
    "resolve",
]
