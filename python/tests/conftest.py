"""Shared helpers: small layers of each preset, random weights, and a float64 oracle written in
numpy apart from the library (it routes by itself and reads quantised weights by itself)."""

import importlib.util

import numpy as np
import pytest

import moekit

HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_TRANSFORMERS = HAS_TORCH and importlib.util.find_spec("transformers") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
needs_transformers = pytest.mark.skipif(not HAS_TRANSFORMERS, reason="transformers (or torch) is not installed")


def cuda_available():
    if not HAS_TORCH:
        return False
    import torch

    return torch.cuda.is_available() and moekit.Platform.probe().gpu_count > 0


PRESETS = ["dsv3", "qwen3-moe", "mixtral"]

# name -> (QuantParams, relative L2 tolerance against the float64 oracle for f32 activations)
FORMATS = {
    "f32": (lambda: moekit.Unquantized("f32"), 1e-5),
    "f16": (lambda: moekit.Unquantized("f16"), 1e-5),
    "bf16": (lambda: moekit.Unquantized("bf16"), 1e-5),
    "fp8-tensor": (lambda: moekit.Fp8Tensor(), 5e-2),
    "fp8-channel": (lambda: moekit.Fp8Tensor("channel"), 5e-2),
    "fp8-block": (lambda: moekit.Fp8Block(32), 5e-2),
    "int4-group": (lambda: moekit.Int4Group(32), 1e-3),
    "int4-group-zero": (lambda: moekit.Int4Group(32, "f16", zero_points=True), 1e-3),
    "int4-group-a8": (lambda: moekit.Int4GroupA8(32), 3e-2),
}


def small_spec(preset):
    """The preset's routing, shared experts and activation at a size that runs in milliseconds."""
    spec = moekit.ModelSpec.preset(preset)
    spec.hidden, spec.intermediate = 64, 32
    if preset == "dsv3":
        spec.n_experts = 16
        spec.routing.top_k = 4
        spec.routing.n_group = 4
        spec.routing.topk_group = 2
        spec.shared_intermediate = 32
    elif preset == "qwen3-moe":
        spec.n_experts = 16
        spec.routing.top_k = 4
    assert spec.problems() == []
    return spec


def round_to_bf16(x):
    """f32 values rounded to the nearest bf16 (ties to even), still as f32."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def random_layer(spec, seed=0):
    """Float weights of `spec` as f32 numpy arrays, exactly representable in bf16 (so f32, f16
    and bf16 layers all hold them exactly)."""
    rng = np.random.default_rng(seed)
    E, H, I = spec.n_experts, spec.hidden, spec.intermediate

    def normal(shape, std):
        return round_to_bf16(rng.standard_normal(shape) * std)

    w = {"w13": normal((E, 2 * I, H), H**-0.5), "w2": normal((E, H, I), I**-0.5)}
    if spec.routing.correction_bias:
        w["correction_bias"] = (rng.standard_normal(E) * 0.1).astype(np.float32)
    if spec.n_shared:
        S, Is = spec.n_shared, spec.shared_intermediate
        w["shared_w13"] = normal((S, 2 * Is, H), H**-0.5)
        w["shared_w2"] = normal((S, H, Is), Is**-0.5)
    if spec.shared_gate:
        w["shared_gate"] = normal((1, H), H**-0.5)
    return w


def random_inputs(spec, tokens, seed=1):
    rng = np.random.default_rng(seed)
    hidden = round_to_bf16(rng.standard_normal((tokens, spec.hidden)))
    logits = round_to_bf16(rng.standard_normal((tokens, spec.n_experts)))
    return hidden, logits


# --- the oracle -------------------------------------------------------------------------------

_E4M3 = np.array(
    [
        (-1.0 if b & 0x80 else 1.0)
        * (((b & 7) / 8.0) * 2.0**-6 if (b >> 3) & 0xF == 0 else (1 + (b & 7) / 8.0) * 2.0 ** (((b >> 3) & 0xF) - 7))
        if (b & 0x7F) != 0x7F
        else np.nan
        for b in range(256)
    ]
)


def _bf16_bits_to_f64(bits):
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def dequantize(q, params, parts):
    """[E, rows, K] float64 from quantize_matrices' output, as docs/QUANTIZATION.md defines the
    formats (read here apart from the library)."""
    weight, scale = q["weight"], q["scale"]
    if params.weight_dtype == "f8e4m3":
        values = _E4M3[weight]
    else:
        nibbles = np.stack([weight & 0xF, weight >> 4], axis=-1).reshape(weight.shape[:-1] + (-1,))
        values = np.where(nibbles >= 8, nibbles.astype(np.int64) - 16, nibbles).astype(np.float64)
    E, rows, K = values.shape
    scale = _bf16_bits_to_f64(scale) if scale.dtype == np.uint16 else scale.astype(np.float64)
    zero = q["zero"].astype(np.float64) if q["zero"] is not None else np.zeros_like(scale)
    N = rows // parts
    per_part = params.scale_rows(N)
    n = np.arange(rows)
    scale_row = (n // N) * per_part + ((n % N) // params.block_rows if params.block_rows else 0)
    k = np.arange(K)
    scale_col = k // params.block_cols if params.block_cols else np.zeros_like(k)
    s = scale[:, scale_row][:, :, scale_col]
    z = zero[:, scale_row][:, :, scale_col]
    return (values - z) * s


def oracle_routing(spec, logits, bias=None):
    r = spec.routing
    x = np.asarray(logits, dtype=np.float64)
    if r.scoring == "softmax":
        e = np.exp(x - x.max(axis=1, keepdims=True))
        scores = e / e.sum(axis=1, keepdims=True)
    elif r.scoring == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-x))
    else:
        scores = np.sqrt(np.logaddexp(0.0, x))
    choice = scores + (np.asarray(bias, dtype=np.float64) if r.correction_bias else 0.0)
    T, E = choice.shape
    if r.n_group > 1:
        groups = choice.reshape(T, r.n_group, E // r.n_group)
        ranked = np.sort(groups, axis=2)
        group_scores = ranked[:, :, -2:].sum(axis=2) if r.group_score == "top2_sum" else ranked[:, :, -1]
        kept = np.argsort(-group_scores, axis=1, kind="stable")[:, : r.topk_group]
        mask = np.zeros((T, r.n_group), dtype=bool)
        np.put_along_axis(mask, kept, True, axis=1)
        choice = np.where(np.repeat(mask, E // r.n_group, axis=1), choice, -np.inf)
    ids = np.argsort(-choice, axis=1, kind="stable")[:, : r.top_k]
    weights = np.take_along_axis(scores, ids, axis=1)
    if r.renormalize:
        weights = weights / weights.sum(axis=1, keepdims=True)
    return ids, weights * r.routed_scaling_factor


def _activate(activation, gate, up):
    if activation.kind == "silu_gated":
        return gate / (1.0 + np.exp(-gate)) * up
    if activation.kind == "gelu_gated":
        from math import erf, sqrt

        return 0.5 * gate * (1.0 + np.vectorize(erf)(gate / sqrt(2.0))) * up
    g = np.minimum(gate, activation.limit)
    u = np.clip(up, -activation.limit, activation.limit)
    return (u + 1.0) * g / (1.0 + np.exp(-activation.alpha * g))


def _mlp(h, w13, w2, activation):
    inner = w13.shape[0] // 2
    return _activate(activation, h @ w13[:inner].T, h @ w13[inner:].T) @ w2.T


def oracle(spec, weights, hidden, logits):
    """(output [T, H], ids [T, k], weights [T, k]) in float64; `weights` hold float64 matrices."""
    h = np.asarray(hidden, dtype=np.float64)
    ids, route_w = oracle_routing(spec, logits, weights.get("correction_bias"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j in range(ids.shape[1]):
            e = ids[t, j]
            out[t] += route_w[t, j] * _mlp(h[t], weights["w13"][e], weights["w2"][e], spec.activation)
    for s in range(spec.n_shared):
        shared = np.stack([_mlp(h[t], weights["shared_w13"][s], weights["shared_w2"][s], spec.activation) for t in range(h.shape[0])])
        if spec.shared_gate:
            shared *= 1.0 / (1.0 + np.exp(-(h @ np.asarray(weights["shared_gate"], dtype=np.float64)[0])))[:, None]
        out += shared
    return out, ids, route_w


def relative_l2(got, want):
    got = np.asarray(got, dtype=np.float64)
    if not np.all(np.isfinite(got)):
        return np.inf
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def quantized_weights(spec, floats, params):
    """The layer's weights quantised by moekit.quantize_matrices (what the layer is given), and
    the float64 matrices the oracle reads from them (dequantised here)."""
    if not params.quantized:
        return dict(floats), {k: np.asarray(v, dtype=np.float64) for k, v in floats.items()}
    given, exact = {}, {}
    for name, value in floats.items():
        if name in ("w13", "w2", "shared_w13", "shared_w2"):
            parts = 2 if name.endswith("w13") else 1
            q = moekit.quantize_matrices(value, parts, params)
            given[name] = q["weight"]
            given[name + "_scale"] = q["scale"]
            if q["zero"] is not None:
                given[name + "_zero"] = q["zero"]
            exact[name] = dequantize(q, params, parts)
        else:
            given[name] = value
            exact[name] = np.asarray(value, dtype=np.float64)
    return given, exact


def sorted_rows(ids, weights):
    order = np.argsort(ids, axis=1)
    return np.take_along_axis(np.asarray(ids), order, axis=1), np.take_along_axis(np.asarray(weights, dtype=np.float64), order, axis=1)
