"""moekit against transformers' own MoE blocks, built tiny and random from configs (no
download): the same outputs (f32 within 1e-5, bf16 within 1e-2) and the same chosen experts."""

import numpy as np
import pytest
from conftest import needs_transformers, relative_l2

pytestmark = needs_transformers

COMMON = dict(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, vocab_size=128)


def make_block(family):
    import transformers

    if family == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, norm_topk_prob=True, **COMMON)
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock as Block
    elif family == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, **COMMON)
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock as Block
    elif family == "olmoe":
        config = transformers.OlmoeConfig(intermediate_size=32, num_experts=16, num_experts_per_tok=4, **COMMON)
        from transformers.models.olmoe.modeling_olmoe import OlmoeSparseMoeBlock as Block
    elif family == "qwen3_next":
        config = transformers.Qwen3NextConfig(
            moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=24, num_experts_per_tok=5, **COMMON
        )
        from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextSparseMoeBlock as Block
    elif family == "qwen2_moe":
        config = transformers.Qwen2MoeConfig(
            moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2, norm_topk_prob=False, **COMMON
        )
        from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock as Block
    else:
        config = transformers.DeepseekV3Config(
            moe_intermediate_size=32,
            intermediate_size=96,
            n_routed_experts=16,
            num_experts_per_tok=4,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            first_k_dense_replace=0,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=8,
            **COMMON,
        )
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as Block
    import torch

    torch.manual_seed(0)
    block = Block(config).eval()
    with torch.no_grad():
        for name, p in block.named_parameters():
            fan_in = p.shape[-1]
            p.normal_(0.0, fan_in**-0.5)
        for name, b in block.named_buffers():
            if "correction_bias" in name:
                b.normal_(0.0, 0.1)
    return block, config


FAMILIES = ["qwen3_moe", "mixtral", "qwen2_moe", "qwen3_next", "olmoe", "deepseek_v3"]


@pytest.mark.parametrize("dtype_name, tolerance", [("float32", 1e-5), ("bfloat16", 1e-2)])
@pytest.mark.parametrize("family", FAMILIES)
def test_block_output_and_experts_match_transformers(family, dtype_name, tolerance):
    import torch

    import moekit
    from moekit.hf import MoeBlock

    dtype = getattr(torch, dtype_name)
    block, config = make_block(family)
    block = block.to(dtype)
    if family == "deepseek_v3":
        block.gate.float()  # as transformers keeps it: the router's weight and bias in float32
    ours = MoeBlock(block, config, moekit.Options(weights="f32" if dtype == torch.float32 else "bf16", max_tokens=64))
    hidden = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.no_grad():
        want = block(hidden)
        got = ours(hidden)
        assert got.dtype == dtype and got.shape == want.shape
        assert relative_l2(got.float().numpy(), want.double().numpy()) < tolerance
        flat = hidden.reshape(-1, 64)
        _, _, want_ids = block.gate(flat)
        _, ids, _ = ours.layer(flat, ours.router_logits(flat), return_routing=True)
    np.testing.assert_array_equal(np.sort(ids.numpy(), axis=1), np.sort(want_ids.numpy(), axis=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_from_the_transformers_config(family):
    import moekit

    block, config = make_block(family)
    spec = moekit.ModelSpec.from_hf_config(config)
    assert spec.hidden == 64 and spec.n_experts == block.experts.gate_up_proj.shape[0]
    assert (spec.n_shared > 0) == (family in ("qwen2_moe", "qwen3_next", "deepseek_v3"))
