"""A small random Qwen3-MoE checkpoint and input file, for `moekit run` smoke checks on a device
machine that has no test data: python3 tiny_checkpoint.py DIR writes DIR/model/ (config.json,
model.safetensors: 2 MoE layers, E=16, top-4, H=256, I=128, bf16) and DIR/input.safetensors
(hidden_states [37, 256] bf16). Standard library only; the values come from a fixed seed.

  python3 tiny_checkpoint.py DIR compare A.safetensors B.safetensors
prints the relative L2 error of B's "output" against A's and exits 1 above 2e-2 (or on NaN).
"""
import array
import json
import math
import os
import random
import struct
import sys

E, K, H, I, LAYERS, T = 16, 4, 256, 128, 2, 37


def bf16_bytes(values):
    words = array.array("I", array.array("f", values).tobytes())
    return array.array("H", ((w + 0x7FFF + ((w >> 16) & 1)) >> 16 for w in words)).tobytes()


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (shape, data) in tensors.items():
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_bf16(path, name):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        entry = header[name]
        f.seek(8 + n + entry["data_offsets"][0])
        raw = f.read(entry["data_offsets"][1] - entry["data_offsets"][0])
    assert entry["dtype"] == "BF16", entry
    return array.array("f", array.array("I", (h << 16 for h in array.array("H", raw))).tobytes())


def make(root):
    rng = random.Random(2024)
    normal = lambda n, s: [rng.gauss(0.0, s) for _ in range(n)]  # noqa: E731
    os.makedirs(f"{root}/model", exist_ok=True)
    config = {"model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
              "hidden_act": "silu", "hidden_size": H, "num_hidden_layers": LAYERS,
              "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 64,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16", "vocab_size": 1024,
              "num_experts_per_tok": K, "intermediate_size": 2 * I, "moe_intermediate_size": I,
              "num_experts": E, "norm_topk_prob": True, "decoder_sparse_step": 1,
              "mlp_only_layers": [], "attention_bias": False, "transformers_version": "4.51.0"}
    json.dump(config, open(f"{root}/model/config.json", "w"), indent=1)
    tensors = {}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors[p + "input_layernorm.weight"] = ([H], bf16_bytes([1.0] * H))
        tensors[p + "mlp.gate.weight"] = ([E, H], bf16_bytes(normal(E * H, 1 / math.sqrt(H))))
        for e in range(E):
            q = f"{p}mlp.experts.{e}."
            tensors[q + "gate_proj.weight"] = ([I, H], bf16_bytes(normal(I * H, 1 / math.sqrt(H))))
            tensors[q + "up_proj.weight"] = ([I, H], bf16_bytes(normal(I * H, 1 / math.sqrt(H))))
            tensors[q + "down_proj.weight"] = ([H, I], bf16_bytes(normal(H * I, 1 / math.sqrt(I))))
    write_safetensors(f"{root}/model/model.safetensors", tensors)
    write_safetensors(f"{root}/input.safetensors", {"hidden_states": ([T, H], bf16_bytes(normal(T * H, 1.0)))})


def compare(a_path, b_path):
    a, b = read_bf16(a_path, "output"), read_bf16(b_path, "output")
    diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    norm = math.sqrt(sum(x * x for x in a))
    error = diff / norm if norm > 0 else float("inf")
    ok = error <= 2e-2 and not math.isnan(error) and len(a) == len(b)
    print(f"{b_path} vs {a_path}: relative L2 {error:.2e} over {len(a)} values: {'ok' if ok else 'FAILED'}")
    return ok


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[2] == "compare":
        sys.exit(0 if compare(sys.argv[3], sys.argv[4]) else 1)
    make(sys.argv[1])
