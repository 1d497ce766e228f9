"""CUDA tensors through the cuda runner, on torch's current stream; skipped without a GPU (or
in a build without CUDA). On a GPU machine: pip install . && python -m pytest python/tests -k cuda"""

import numpy as np
import pytest
from conftest import PRESETS, cuda_available, oracle, quantized_weights, random_inputs, random_layer, relative_l2, small_spec

import moekit

pytestmark = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU (or torch without CUDA, or moekit built without CUDA)")

# What the cuda core reads (src/runner/cuda/cuda_core.cpp, cuda_reads): bf16/f16 and fp8 with
# 128 x 128 blocks, per tensor or per channel; the GEMMs take their inputs in the weights' dtype.
CUDA_FORMATS = {
    "bf16": (lambda: moekit.Unquantized("bf16"), 1e-2),
    "f16": (lambda: moekit.Unquantized("f16"), 1e-2),
    "fp8-block": (lambda: moekit.Fp8Block(128), 5e-2),
    "fp8-tensor": (lambda: moekit.Fp8Tensor(), 5e-2),
    "fp8-channel": (lambda: moekit.Fp8Tensor("channel"), 5e-2),
}


def cuda_layer(preset, fmt, max_tokens=64):
    spec = small_spec(preset)
    params = CUDA_FORMATS[fmt][0]()
    plan = moekit.resolve(spec, moekit.Options(device="cuda:0", weights=params, max_tokens=max_tokens))
    assert plan.runner == "cuda"
    given, exact = quantized_weights(spec, random_layer(spec), plan.quant)
    return spec, moekit.MoeLayer(plan, given), exact


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("fmt", list(CUDA_FORMATS))
@pytest.mark.parametrize("preset", PRESETS)
def test_cuda_matches_oracle(preset, fmt, dtype_name):
    import torch

    dtype = getattr(torch, dtype_name)
    spec, layer, exact = cuda_layer(preset, fmt)
    hidden, logits = random_inputs(spec, 9)
    h = torch.from_numpy(hidden).to("cuda", dtype)
    l = torch.from_numpy(logits).to("cuda", dtype)
    out, ids, weights = layer(h, l, return_routing=True)
    assert out.device == h.device and out.dtype == dtype and ids.is_cuda
    want, want_ids, _ = oracle(spec, exact, h.double().cpu().numpy(), l.double().cpu().numpy())
    assert relative_l2(out.double().cpu().numpy(), want) < CUDA_FORMATS[fmt][1]
    np.testing.assert_array_equal(np.sort(ids.cpu().numpy(), axis=1), np.sort(want_ids, axis=1))


def test_cuda_runs_on_torchs_current_stream_and_writes_out_in_place():
    import torch

    spec, layer, exact = cuda_layer("dsv3", "bf16")
    hidden, logits = random_inputs(spec, 16)
    h, l = torch.from_numpy(hidden).cuda(), torch.from_numpy(logits).cuda()
    out = torch.full_like(h, float("nan"))
    assert moekit._moekit._view(h)["data_ptr"] == h.data_ptr()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # queued behind each other on the side stream, no host wait between
            result = layer(h, l, out=out)
    side.synchronize()
    assert result is out
    assert relative_l2(out.double().cpu().numpy(), oracle(spec, exact, hidden, logits)[0]) < 1e-2


def test_cuda_graph_capture_of_the_custom_op():
    import torch

    spec, layer, exact = cuda_layer("qwen3-moe", "bf16")
    hidden, logits = random_inputs(spec, 8)
    h = torch.from_numpy(hidden).cuda().to(torch.bfloat16)
    l = torch.from_numpy(logits).cuda().to(torch.bfloat16)
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        torch.ops.moekit.moe(h, l, layer.handle)
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.moekit.moe(h, l, layer.handle)
    hidden2, logits2 = random_inputs(spec, 8, seed=5)
    h.copy_(torch.from_numpy(hidden2).to(torch.bfloat16))
    l.copy_(torch.from_numpy(logits2).to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    want = oracle(spec, exact, h.double().cpu().numpy(), l.double().cpu().numpy())[0]
    assert relative_l2(out.double().cpu().numpy(), want) < 1e-2


def test_cuda_compile_fullgraph():
    import torch

    spec, layer, exact = cuda_layer("mixtral", "bf16")
    hidden, logits = random_inputs(spec, 4)
    h, l = torch.from_numpy(hidden).cuda(), torch.from_numpy(logits).cuda()
    compiled = torch.compile(lambda a, b: torch.ops.moekit.moe(a, b, layer.handle) * 2, fullgraph=True)
    assert relative_l2(compiled(h, l).double().cpu().numpy() / 2, oracle(spec, exact, hidden, logits)[0]) < 1e-2


def test_cuda_nan_is_reported_by_synchronize():
    import torch

    spec, layer, _ = cuda_layer("mixtral", "bf16")
    hidden, logits = random_inputs(spec, 4)
    hidden[2, 3] = np.nan
    layer(torch.from_numpy(hidden).cuda(), torch.from_numpy(logits).cuda())
    with pytest.raises(ValueError, match="hidden_states"):
        layer.synchronize()


def test_cuda_plan_refuses_host_tensors_and_other_devices():
    import torch

    spec, layer, _ = cuda_layer("mixtral", "bf16")
    hidden, logits = random_inputs(spec, 4)
    with pytest.raises(ValueError, match="the plan runs on cuda:0"):
        layer(hidden, logits)
    with pytest.raises(ValueError, match="router_logits"):
        layer(torch.from_numpy(hidden).cuda(), torch.from_numpy(logits))


def test_cuda_weights_on_the_gpu_are_accepted():
    import torch

    spec = small_spec("dsv3")
    plan = moekit.resolve(spec, moekit.Options(device="cuda:0", weights="bf16", max_tokens=8))
    floats = random_layer(spec)
    layer = moekit.MoeLayer(plan, {k: torch.from_numpy(v).cuda() for k, v in floats.items()})
    hidden, logits = random_inputs(spec, 4)
    out = layer(torch.from_numpy(hidden).cuda(), torch.from_numpy(logits).cuda())
    exact = {k: v.astype(np.float64) for k, v in floats.items()}
    assert relative_l2(out.double().cpu().numpy(), oracle(spec, exact, hidden, logits)[0]) < 1e-2
