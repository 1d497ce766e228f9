"""Replace the MoE blocks of a transformers Qwen3-MoE model with moekit's layer, and check that
greedy generation gives the same tokens.

The model is built from a small random config (nothing is downloaded). Run it after
`pip install .` (and `pip install torch transformers`):

    python python/examples/qwen3_moe_generate.py [--weights bf16|fp8-block|int4-group] [--device cuda]
"""

import argparse

import torch
import transformers

import moekit
import moekit.hf


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--weights", default="f32", help="moekit's weight format (f32 holds the model's weights exactly)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (the moekit layer runs where the model is)")
    parser.add_argument("--tokens", type=int, default=24, help="tokens to generate")
    args = parser.parse_args(argv)

    config = transformers.Qwen3MoeConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=16,
        num_experts_per_tok=4,
        norm_topk_prob=True,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(config).eval().to(args.device)
    with torch.no_grad():  # weights of a trained model's scale, so that the experts matter
        for name, p in model.named_parameters():
            if "experts" in name or "gate" in name:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    prompt = torch.randint(0, config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(1)).to(args.device)
    generate = dict(max_new_tokens=args.tokens, do_sample=False, pad_token_id=0)

    with torch.no_grad():
        want = model.generate(prompt, **generate)
        options = moekit.Options(weights=args.weights, device=args.device, max_tokens=64)
        replaced = moekit.hf.replace_moe_blocks(model, options)
        print(model.model.layers[replaced[0]].mlp.plan.explain())
        got = model.generate(prompt, **generate)

    same = torch.equal(got, want)
    print(f"moekit replaced the MoE blocks of layers {replaced}")
    print("transformers:", want[0, prompt.shape[1]:].tolist())
    print("moekit:      ", got[0, prompt.shape[1]:].tolist())
    print("the same tokens" if same else "the tokens differ")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
