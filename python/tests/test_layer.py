"""Every preset in every weight format against the float64 oracle, from numpy and from torch;
out= in place; no copy of contiguous inputs."""

import numpy as np
import pytest
from conftest import (
    FORMATS,
    PRESETS,
    needs_torch,
    oracle,
    quantized_weights,
    random_inputs,
    random_layer,
    relative_l2,
    small_spec,
    sorted_rows,
)

import moekit

TOKENS = 7


def build(preset, fmt, online=False, seed=0):
    spec = small_spec(preset)
    params, tolerance = FORMATS[fmt][0](), FORMATS[fmt][1]
    plan = moekit.resolve(spec, moekit.Options(weights=params, max_tokens=32, threads=2))
    floats = random_layer(spec, seed)
    given, exact = quantized_weights(spec, floats, plan.quant)
    if fmt == "f16":
        given = {k: (v.astype(np.float16) if k in ("w13", "w2", "shared_w13", "shared_w2") else v) for k, v in given.items()}
    layer = moekit.MoeLayer(plan, floats if online else given)
    return spec, layer, exact, tolerance


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("preset", PRESETS)
def test_numpy_matches_oracle(preset, fmt):
    spec, layer, exact, tolerance = build(preset, fmt)
    hidden, logits = random_inputs(spec, TOKENS)
    out, ids, weights = layer(hidden, logits, return_routing=True)
    want, want_ids, want_w = oracle(spec, exact, hidden, logits)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32 and out.shape == hidden.shape
    assert relative_l2(out, want) < tolerance
    got_ids, got_w = sorted_rows(ids, weights)
    ref_ids, ref_w = sorted_rows(want_ids, want_w)
    np.testing.assert_array_equal(got_ids, ref_ids)
    np.testing.assert_allclose(got_w, ref_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fmt", ["bf16", "fp8-block", "int4-group"])
def test_float_weights_quantised_at_load_match_the_same_oracle(fmt):
    spec, layer, exact, tolerance = build("dsv3", fmt, online=True)
    hidden, logits = random_inputs(spec, TOKENS)
    want, _, _ = oracle(spec, exact, hidden, logits)
    assert relative_l2(layer(hidden, logits), want) < tolerance


def test_out_is_written_in_place():
    spec, layer, exact, tolerance = build("qwen3-moe", "f32")
    hidden, logits = random_inputs(spec, TOKENS)
    out = np.full(hidden.shape, np.nan, dtype=np.float32)  # poisoned: every element is written
    result = layer(hidden, logits, out=out)
    assert result is out
    assert relative_l2(out, oracle(spec, exact, hidden, logits)[0]) < tolerance


def test_contiguous_numpy_inputs_are_read_without_a_copy():
    hidden = np.ones((4, 64), dtype=np.float32)
    view = moekit._moekit._view(hidden)
    assert view["data_ptr"] == hidden.ctypes.data
    assert view["shape"] == (4, 64) and view["strides"] == (64, 1) and view["contiguous"]


def test_tokens_in_leading_dimensions_keep_their_shape():
    spec, layer, exact, tolerance = build("mixtral", "f32")
    hidden, logits = random_inputs(spec, 6)
    out = layer(hidden.reshape(2, 3, -1), logits.reshape(2, 3, -1))
    assert out.shape == (2, 3, spec.hidden)
    assert relative_l2(out.reshape(6, -1), oracle(spec, exact, hidden, logits)[0]) < tolerance


def test_no_tokens_gives_an_empty_output():
    spec, layer, _, _ = build("mixtral", "f32")
    out = layer(np.zeros((0, spec.hidden), np.float32), np.zeros((0, spec.n_experts), np.float32))
    assert out.shape == (0, spec.hidden)


def test_weights_may_be_freed_once_the_layer_is_built():
    import gc

    spec = small_spec("mixtral")
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=8))
    weights = random_layer(spec)
    exact = {k: v.astype(np.float64) for k, v in weights.items()}
    layer = moekit.MoeLayer(plan, weights)
    for value in weights.values():
        value.fill(np.nan)
    del weights
    gc.collect()
    hidden, logits = random_inputs(spec, 3)
    assert relative_l2(layer(hidden, logits), oracle(spec, exact, hidden, logits)[0]) < 1e-5


# --- torch ------------------------------------------------------------------------------------


def torch_case(preset, fmt, dtype):
    import torch

    spec, layer, exact, tolerance = build(preset, fmt)
    hidden, logits = random_inputs(spec, TOKENS)
    h = torch.from_numpy(hidden).to(dtype)
    l = torch.from_numpy(logits).to(dtype)
    return spec, layer, exact, tolerance, h, l


@needs_torch
@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("preset", PRESETS)
def test_torch_matches_oracle(preset, fmt, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    spec, layer, exact, tolerance, h, l = torch_case(preset, fmt, dtype)
    out, ids, weights = layer(h, l, return_routing=True)
    assert isinstance(out, torch.Tensor) and out.dtype == dtype and out.shape == h.shape
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    want, want_ids, _ = oracle(spec, exact, h.double().numpy(), l.double().numpy())
    limit = tolerance if dtype == torch.float32 else max(tolerance, 1e-2)
    assert relative_l2(out.double().numpy(), want) < limit
    if dtype == torch.float32:
        np.testing.assert_array_equal(np.sort(ids.numpy(), axis=1), np.sort(want_ids, axis=1))


@needs_torch
def test_torch_out_is_written_in_place_and_inputs_are_not_copied():
    import torch

    spec, layer, exact, tolerance, h, l = torch_case("dsv3", "bf16", torch.float32)
    out = torch.full_like(h, float("nan"))
    assert moekit._moekit._view(h)["data_ptr"] == h.data_ptr()
    assert moekit._moekit._view(l)["data_ptr"] == l.data_ptr()
    result = layer(h, l, out=out)
    assert result is out
    assert relative_l2(out.numpy(), oracle(spec, exact, h.numpy(), l.numpy())[0]) < tolerance


@needs_torch
def test_torch_weights_that_require_grad_are_read_in_place():
    import torch

    spec = small_spec("qwen3-moe")
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=8))
    floats = random_layer(spec)
    params = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in floats.items()}
    assert moekit._moekit._view(params["w13"].detach())["data_ptr"] == params["w13"].data_ptr()
    layer = moekit.MoeLayer(plan, params)
    hidden, logits = random_inputs(spec, 4)
    want = oracle(spec, {k: v.astype(np.float64) for k, v in floats.items()}, hidden, logits)[0]
    assert relative_l2(layer(torch.from_numpy(hidden), torch.from_numpy(logits)).numpy(), want) < 1e-5


@needs_torch
def test_torch_float8_weights_are_taken_as_e4m3():
    import torch

    spec, _, exact, tolerance = build("mixtral", "fp8-block")
    plan = moekit.resolve(spec, moekit.Options(weights=moekit.Fp8Block(32), max_tokens=8))
    given, exact = quantized_weights(spec, random_layer(spec), plan.quant)
    for name in ("w13", "w2"):
        given[name] = torch.from_numpy(given[name]).view(torch.float8_e4m3fn)
    layer = moekit.MoeLayer(plan, given)
    hidden, logits = random_inputs(spec, 4)
    assert relative_l2(layer(hidden, logits), oracle(spec, exact, hidden, logits)[0]) < tolerance


CUSTOM_SPECS = {
    "sqrt_softplus": dict(routing=dict(scoring="sqrt_softplus", top_k=3, renormalize=True, routed_scaling_factor=1.5)),
    "sigmoid_top1": dict(routing=dict(scoring="sigmoid", top_k=1)),
    "grouped_max_no_bias": dict(routing=dict(scoring="sigmoid", top_k=4, n_group=4, topk_group=2, group_score="max", renormalize=True)),
    "softmax_no_renorm": dict(routing=dict(scoring="softmax", top_k=3)),
    "gelu": dict(routing=dict(top_k=2, renormalize=True), activation="gelu"),
    "swiglu_oai": dict(routing=dict(top_k=2, renormalize=True), activation="swiglu"),
    "qwen2_shared_gate": dict(routing=dict(top_k=2), n_shared=1, shared_intermediate=48, shared_gate=True),
}


@pytest.mark.parametrize("case", list(CUSTOM_SPECS))
def test_specs_made_in_python_match_oracle(case):
    fields = dict(CUSTOM_SPECS[case])
    activation = fields.pop("activation", None)
    spec = moekit.ModelSpec(name=case, hidden=48, intermediate=24, n_experts=16, routing=moekit.RoutingSpec(**fields.pop("routing")), **fields)
    if activation == "gelu":
        spec.activation = moekit.Activation.GeluGated()
    elif activation == "swiglu":
        spec.activation = moekit.Activation.SwigluOai(1.702, 7.0)
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=16))
    weights = random_layer(spec, seed=4)
    layer = moekit.MoeLayer(plan, weights)
    hidden, logits = random_inputs(spec, 9, seed=5)
    out, ids, _ = layer(hidden, logits, return_routing=True)
    want, want_ids, _ = oracle(spec, {k: v.astype(np.float64) for k, v in weights.items()}, hidden, logits)
    assert relative_l2(out, want) < 1e-5
    np.testing.assert_array_equal(np.sort(ids, axis=1), np.sort(want_ids, axis=1))


@needs_torch
def test_torch_int4_bytes_and_bf16_scales():
    import torch

    spec = small_spec("qwen3-moe")
    plan = moekit.resolve(spec, moekit.Options(weights=moekit.Int4Group(32), max_tokens=8))
    given, exact = quantized_weights(spec, random_layer(spec), plan.quant)
    as_torch = {k: torch.from_numpy(v) for k, v in given.items()}
    for name in ("w13_scale", "w2_scale"):  # bf16 scales as torch bf16, not bits
        as_torch[name] = torch.from_numpy(given[name].view(np.int16)).view(torch.bfloat16)
    layer = moekit.MoeLayer(plan, as_torch)
    hidden, logits = random_inputs(spec, 5)
    out = layer(torch.from_numpy(hidden), torch.from_numpy(logits))
    assert relative_l2(out.numpy(), oracle(spec, exact, hidden, logits)[0]) < 1e-3
