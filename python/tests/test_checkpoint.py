"""Checkpoint.open on a tiny Mixtral saved by transformers (safetensors, no download): the spec,
the router and the layer read from disk give the block's own output."""

import pytest
from conftest import needs_transformers, relative_l2

import moekit


@needs_transformers
def test_checkpoint_layer_matches_the_saved_models_block(tmp_path):
    import torch
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=64, intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    )
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "experts" in name or "gate" in name:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    model.save_pretrained(tmp_path)
    checkpoint = moekit.Checkpoint.open(tmp_path)
    assert checkpoint.moe_layers == [0, 1]
    spec = checkpoint.spec(1)
    assert (spec.hidden, spec.n_experts, spec.routing.top_k) == (64, 8, 2)
    plan = moekit.resolve(spec, moekit.Options(weights=checkpoint.format_for(1, "f32"), max_tokens=16))
    layer = checkpoint.load(1, plan)
    hidden = torch.randn(5, 64)
    logits = checkpoint.router(1).logits(hidden)
    with torch.no_grad():
        want = model.model.layers[1].mlp(hidden[None])[0]
        torch.testing.assert_close(logits, torch.nn.functional.linear(hidden, model.model.layers[1].mlp.gate.weight), rtol=1e-5, atol=1e-5)
    assert relative_l2(layer(hidden, logits).numpy(), want.double().numpy()) < 1e-5
    router = checkpoint.router(1)
    for bad, match in [(hidden[:, :10], "hidden_states: expected contiguous"), (hidden.double(), "float64"), (hidden.int(), "dtype must be")]:
        with pytest.raises((ValueError, TypeError), match=match):
            router.logits(bad)
    with pytest.raises(ValueError, match="router_logits: expected shape"):
        router.logits(hidden, out=torch.empty(5, 7))
    with pytest.raises(ValueError, match="overlapped asked|a2a|refused"):
        moekit.resolve(spec, moekit.Options(a2a="nccl"))
    with pytest.raises(ValueError, match="no MoE weights|outside"):
        checkpoint.spec(7)
