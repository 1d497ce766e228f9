"""torch.ops.moekit.moe and torch.ops.moekit.moe_routing: the layer as torch custom ops.

The layer is named by its handle (MoeLayer.handle), an integer that torch.compile keeps in the
graph as a constant. The fake implementations give the outputs' shapes and dtypes without running
anything, so a model calling the op compiles without a graph break (fullgraph=True); on a GPU
the op enqueues the whole layer on torch's current stream with no allocation of its own and no
host synchronisation, so it can be captured in a CUDA graph.
"""

import torch

from ._layer import layer_of


@torch.library.custom_op("moekit::moe", mutates_args=())
def moe(hidden_states: torch.Tensor, router_logits: torch.Tensor, layer: int) -> torch.Tensor:
    """The output of moekit layer `layer` (a MoeLayer.handle): hidden's shape and dtype."""
    return layer_of(layer).forward(hidden_states, router_logits)


@moe.register_fake
def _(hidden_states, router_logits, layer):
    return torch.empty_like(hidden_states, memory_format=torch.contiguous_format)


@torch.library.custom_op("moekit::moe_routing", mutates_args=())
def moe_routing(
    hidden_states: torch.Tensor, router_logits: torch.Tensor, layer: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The output, and the routing it used: topk_ids int32 [T, k], topk_weights f32 [T, k]."""
    return layer_of(layer).forward(hidden_states, router_logits, return_routing=True)


@moe_routing.register_fake
def _(hidden_states, router_logits, layer):
    k = layer_of(layer).top_k
    rows = (hidden_states.reshape(-1, hidden_states.shape[-1]).shape[0], k)
    return (
        torch.empty_like(hidden_states, memory_format=torch.contiguous_format),
        hidden_states.new_empty(rows, dtype=torch.int32),
        hidden_states.new_empty(rows, dtype=torch.float32),
    )
