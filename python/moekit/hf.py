"""Hugging Face transformers (>= 5) MoE blocks run by moekit.

transformers 5 keeps a block's routed experts as two stacked parameters, experts.gate_up_proj
[E, 2I, H] (gate rows then up rows) and experts.down_proj [E, H, I]: moekit's w13 and w2, read
in place. The shared expert's gate and up projections are stacked into one [1, 2I, H] (one copy,
at load time). The block's own router weight makes the logits, in the dtype its router uses.

    block = model.model.layers[3].mlp                       # Qwen3MoeSparseMoeBlock, ...
    model.model.layers[3].mlp = moekit.hf.MoeBlock(block, model.config, layer=3)
"""

import torch
import torch.nn.functional as F

from . import _moekit
from ._layer import MoeLayer
from ._spec import from_hf_config

_MOE_BLOCKS = (
    "Qwen3MoeSparseMoeBlock",
    "MixtralSparseMoeBlock",
    "Qwen2MoeSparseMoeBlock",
    "Qwen3NextSparseMoeBlock",
    "OlmoeSparseMoeBlock",
    "DeepseekV3MoE",
)


def is_moe_block(module):
    return type(module).__name__ in _MOE_BLOCKS


def block_weights(block):
    """The tensors of a transformers MoE block by moekit's names."""
    if not is_moe_block(block):
        raise TypeError(f"block: expected one of {', '.join(_MOE_BLOCKS)}, got {type(block).__name__}")
    weights = {"w13": block.experts.gate_up_proj, "w2": block.experts.down_proj}
    bias = getattr(block.gate, "e_score_correction_bias", None)
    if bias is not None:
        weights["correction_bias"] = bias.detach().float()
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    if shared is not None:
        with torch.no_grad():
            weights["shared_w13"] = torch.cat([shared.gate_proj.weight, shared.up_proj.weight])[None]
        weights["shared_w2"] = shared.down_proj.weight[None]
    shared_gate = getattr(block, "shared_expert_gate", None)
    if shared_gate is not None:
        weights["shared_gate"] = shared_gate.weight
    return weights


class MoeBlock(torch.nn.Module):
    """A drop-in for a transformers MoE block: the block's router, then moekit's layer through
    torch.ops.moekit.moe (so torch.compile keeps it in one graph)."""

    def __init__(self, block, config, options=None, layer=None):
        super().__init__()
        spec = from_hf_config(config, layer)
        self.plan = _moekit.resolve(spec, options if options is not None else _moekit.Options())
        self.layer = MoeLayer(self.plan, block_weights(block))
        self.router_weight = torch.nn.Parameter(block.gate.weight.detach(), requires_grad=False)
        # DeepSeek-V3's router computes its logits in float32 whatever the model's dtype.
        self.float32_logits = hasattr(block.gate, "e_score_correction_bias")

    def router_logits(self, hidden):
        if self.float32_logits:
            return F.linear(hidden.float(), self.router_weight.float())
        return F.linear(hidden, self.router_weight.to(hidden.dtype))

    def forward(self, hidden_states):
        shape = hidden_states.shape
        hidden = hidden_states.reshape(-1, shape[-1])
        out = torch.ops.moekit.moe(hidden, self.router_logits(hidden), self.layer.handle)
        return out.reshape(shape)


def replace_moe_blocks(model, options=None):
    """Replaces every MoE block of a transformers decoder (model.model.layers[i].mlp) with a
    MoeBlock; returns the layer indices replaced."""
    replaced = []
    for index, decoder_layer in enumerate(model.model.layers):
        if is_moe_block(decoder_layer.mlp):
            decoder_layer.mlp = MoeBlock(decoder_layer.mlp, model.config, options, layer=index)
            replaced.append(index)
    return replaced
