"""torch.ops.moekit.moe: a custom op with a fake implementation, compiled without a graph break."""

import numpy as np
import pytest
from conftest import needs_torch, oracle, random_inputs, random_layer, relative_l2, small_spec

import moekit

pytestmark = needs_torch


def make_layer(preset="dsv3"):
    spec = small_spec(preset)
    weights = random_layer(spec)
    layer = moekit.MoeLayer(moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=64)), weights)
    exact = {k: v.astype(np.float64) for k, v in weights.items()}
    return spec, layer, exact


def test_the_op_runs_the_layer():
    import torch

    spec, layer, exact = make_layer()
    hidden, logits = random_inputs(spec, 5)
    out = torch.ops.moekit.moe(torch.from_numpy(hidden), torch.from_numpy(logits), layer.handle)
    assert relative_l2(out.numpy(), oracle(spec, exact, hidden, logits)[0]) < 1e-5
    out, ids, weights = torch.ops.moekit.moe_routing(torch.from_numpy(hidden), torch.from_numpy(logits), layer.handle)
    assert ids.shape == (5, spec.routing.top_k) and ids.dtype == torch.int32


def test_opcheck():
    import torch

    spec, layer, _ = make_layer("mixtral")
    hidden, logits = (torch.from_numpy(a) for a in random_inputs(spec, 4))
    torch.library.opcheck(torch.ops.moekit.moe.default, (hidden, logits, layer.handle))
    torch.library.opcheck(torch.ops.moekit.moe_routing.default, (hidden, logits, layer.handle))


def test_a_module_calling_the_op_compiles_in_one_graph():
    import torch

    spec, layer, exact = make_layer()
    rng = np.random.default_rng(3)
    router = torch.from_numpy((rng.standard_normal((spec.n_experts, spec.hidden)) * 0.2).astype(np.float32))

    class Block(torch.nn.Module):
        def forward(self, x):
            h = torch.nn.functional.rms_norm(x, (x.shape[-1],))
            return x + torch.ops.moekit.moe(h, h @ router.T, layer.handle)

    block = Block()
    x = torch.from_numpy(random_inputs(spec, 6)[0])
    explanation = torch._dynamo.explain(block)(x)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    # aot_eager traces the op through its fake implementation as inductor does, without
    # compiling C++ (inductor works too, at 25 s more).
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), block(x), rtol=1e-5, atol=1e-5)


def test_an_unknown_handle_is_a_value_error():
    import torch

    with pytest.raises(ValueError, match="no live moekit.MoeLayer"):
        torch.ops.moekit.moe(torch.zeros(1, 64), torch.zeros(1, 8), 10**9)
