"""Every malformed argument raises a Python exception with moekit's message; none crashes."""

import numpy as np
import pytest
from conftest import needs_torch, random_inputs, random_layer, small_spec

import moekit


@pytest.fixture(scope="module")
def layer():
    spec = small_spec("mixtral")
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=8))
    return moekit.MoeLayer(plan, random_layer(spec))


def inputs(tokens=3):
    return random_inputs(small_spec("mixtral"), tokens)


def test_config_refused_is_a_value_error_with_the_reason():
    assert issubclass(moekit.ConfigRefused, ValueError)
    with pytest.raises(moekit.ConfigRefused, match="a2a"):
        moekit.resolve(small_spec("mixtral"), moekit.Options(a2a="mpi"))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"runner": "tpu"}, "runner: 'tpu' is not one of"),
        ({"a2a": "smoke"}, "a2a"),
        ({"weights": "int3"}, "weights: 'int3'"),
        ({"form": "fancy"}, "form"),
        ({"device": "gpu7"}, "gpu7"),
    ],
)
def test_unknown_option_names(kwargs, match):
    with pytest.raises(ValueError, match=match):
        moekit.Options(**kwargs)


def test_options_are_keyword_only():
    with pytest.raises(TypeError):
        moekit.Options("cpu")


@pytest.mark.parametrize(
    "make",
    [lambda: moekit.Fp8Block(0), lambda: moekit.Int4Group(-4), lambda: moekit.Int4Group(64, "f32")],
)
def test_impossible_format_parameters(make):
    with pytest.raises(ValueError):
        make()


def test_impossible_spec_is_refused_by_resolve():
    spec = small_spec("mixtral")
    spec.routing.top_k = 99
    with pytest.raises(ValueError, match="top-k 99"):
        moekit.resolve(spec, moekit.Options())


def test_preset_and_files_that_do_not_exist(tmp_path):
    with pytest.raises(ValueError, match="unknown preset"):
        moekit.ModelSpec.preset("gpt-5")
    with pytest.raises(OSError):
        moekit.ModelSpec.from_json(tmp_path / "absent.json")
    with pytest.raises(OSError):
        moekit.Checkpoint.open(tmp_path)
    (tmp_path / "bad.json").write_text('{"hidden": "wide"}')
    with pytest.raises(ValueError, match="hidden"):
        moekit.ModelSpec.from_json(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "change, error, match",
    [
        (lambda h, l: (h.astype(np.float64), l), TypeError, "hidden_states: dtype float64"),
        (lambda h, l: (h.astype(np.int32), l), ValueError, "hidden_states: dtype must be"),
        (lambda h, l: (h[:, :10], l), ValueError, "hidden_states: expected shape"),
        (lambda h, l: (h, l[:2]), ValueError, "router_logits: expected shape"),
        (lambda h, l: (h[:, ::2].repeat(2, axis=1)[:, ::1], l), None, None),
        (lambda h, l: (np.asfortranarray(h), l), ValueError, "hidden_states: must be contiguous"),
        (lambda h, l: (h, l.T.copy().T), ValueError, "router_logits: must be contiguous"),
        (lambda h, l: ([[1.0] * 64], l), TypeError, "hidden_states: expected a tensor"),
        (lambda h, l: (h, None), TypeError, "router_logits"),
        (lambda h, l: (np.ones((9, 64), np.float32), np.ones((9, 8), np.float32)), ValueError, "max_tokens"),
        (lambda h, l: (h.reshape(3, 64, 1, 1, 1), l), ValueError, "5 dimensions, moekit takes at most 4"),
    ],
)
def test_bad_inputs(layer, change, error, match):
    hidden, logits = change(*inputs())
    if error is None:
        layer(hidden, logits)
        return
    with pytest.raises(error, match=match):
        layer(hidden, logits)


def test_nan_input_is_refused_naming_the_tensor(layer):
    hidden, logits = inputs()
    hidden[1, 5] = np.nan
    with pytest.raises(ValueError, match="hidden_states"):
        layer(hidden, logits)


@pytest.mark.parametrize(
    "out, error, match",
    [
        (np.empty((3, 64), np.float16), ValueError, "output: dtype must match"),
        (np.empty((3, 63), np.float32), ValueError, "output: expected shape"),
        (np.empty((64, 3), np.float32).T, ValueError, "output: must be contiguous"),
        ("out", TypeError, "output: expected a tensor"),
    ],
)
def test_bad_out(layer, out, error, match):
    hidden, logits = inputs()
    with pytest.raises(error, match=match):
        layer(hidden, logits, out=out)


def test_read_only_out_is_refused(layer):
    hidden, logits = inputs()
    out = np.empty((3, 64), np.float32)
    out.setflags(write=False)
    with pytest.raises(ValueError, match="output: read-only"):
        layer(hidden, logits, out=out)


def test_out_that_overlaps_the_input_is_refused(layer):
    hidden, logits = inputs()
    with pytest.raises(ValueError, match="overlaps"):
        layer(hidden, logits, out=hidden)


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (lambda w: w.pop("w2"), ValueError, "'w2' is missing"),
        (lambda w: w.update(w4=w["w2"]), ValueError, "unknown key 'w4'"),
        (lambda w: w.update({7: w["w2"]}), TypeError, "keys are the tensors' names"),
        (lambda w: w.update(w13=w["w13"][:, :10]), ValueError, "w13|gate/up"),
        (lambda w: w.update(w2=w["w2"].astype(np.float64)), TypeError, "float64"),
        (lambda w: w.update(w2="weights"), TypeError, "weights\\['w2'\\]: expected a tensor"),
    ],
)
def test_bad_weights(edit, error, match):
    spec = small_spec("mixtral")
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=8))
    weights = random_layer(spec)
    edit(weights)
    with pytest.raises(error, match=match):
        moekit.MoeLayer(plan, weights)


def test_weights_and_plan_of_the_wrong_types():
    with pytest.raises(TypeError, match="plan"):
        moekit.MoeLayer("plan", {})
    plan = moekit.resolve(small_spec("mixtral"), moekit.Options(max_tokens=8))
    with pytest.raises(TypeError, match="weights"):
        moekit.MoeLayer(plan, [1, 2])


def test_missing_correction_bias_is_named():
    spec = small_spec("dsv3")
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=8))
    weights = random_layer(spec)
    del weights["correction_bias"]
    with pytest.raises(ValueError, match="correction_bias"):
        moekit.MoeLayer(plan, weights)


def test_scratch_that_cannot_be_allocated_is_a_memory_error():
    # The widest layer at the most tokens: 140 TB of scratch, allocated before any weight is read.
    spec = moekit.ModelSpec(name="wide", hidden=1 << 20, intermediate=32, n_experts=8, routing=moekit.RoutingSpec(top_k=2))
    plan = moekit.resolve(spec, moekit.Options(weights="f32", max_tokens=1 << 24))
    tiny = np.zeros((1, 2, 2), np.float32)
    with pytest.raises(MemoryError, match="could not allocate"):
        moekit.MoeLayer(plan, {"w13": tiny, "w2": tiny})


def test_max_tokens_whose_scratch_would_overflow_is_refused():
    with pytest.raises(moekit.ConfigRefused, match="max_tokens"):
        moekit.resolve(small_spec("mixtral"), moekit.Options(max_tokens=1 << 62))


def test_routing_buffers_of_the_wrong_shape(layer):
    hidden, logits = inputs()
    with pytest.raises(ValueError, match="topk_ids"):
        layer._layer.forward(hidden, logits, np.empty_like(hidden), np.empty((3, 5), np.int32), np.empty((3, 2), np.float32), None)
    with pytest.raises(ValueError, match="both or neither"):
        layer._layer.forward(hidden, logits, np.empty_like(hidden), np.empty((3, 2), np.int32), None, None)


@needs_torch
def test_torch_tensors_on_the_wrong_device_or_dtype(layer):
    import torch

    hidden, logits = (torch.from_numpy(a) for a in inputs())
    with pytest.raises(TypeError):
        layer(hidden.to("meta"), logits.to("meta"))
    with pytest.raises(TypeError, match="float64"):
        layer(hidden.double(), logits)
    with pytest.raises(ValueError, match="must be contiguous"):
        layer(hidden.t().contiguous().t(), logits)
    with pytest.raises(ValueError, match="output: dtype must match"):
        layer(hidden, logits, out=torch.empty_like(hidden, dtype=torch.bfloat16))
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="the plan runs on cpu"):
            layer(hidden.cuda(), logits.cuda())


def test_a_layer_can_be_used_from_threads(layer):
    from concurrent.futures import ThreadPoolExecutor

    hidden, logits = inputs()
    want = layer(hidden, logits)
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: layer(hidden, logits), range(16)))
    for got in results:
        np.testing.assert_array_equal(got, want)
