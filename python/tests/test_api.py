"""The API around the layer: specs, options and their formats, plans, the version."""

import json
import re

import pytest

import moekit


def test_version_comes_from_cmake_project_line():
    assert re.fullmatch(r"\d+\.\d+\.\d+", moekit.__version__)


@pytest.mark.parametrize("name", ["dsv3", "qwen3-moe", "mixtral"])
def test_presets_have_real_sizes(name):
    spec = moekit.ModelSpec.preset(name)
    assert spec.name == name and spec.hidden >= 2048 and spec.problems() == []


def test_preset_names():
    assert moekit.ModelSpec.preset_names() == ["dsv3", "qwen3-moe", "mixtral"]


def test_spec_fields_are_read_and_written_by_their_names():
    spec = moekit.ModelSpec.preset("dsv3")
    spec.routing.top_k = 6
    spec.routing.scoring = "softmax"
    spec.activation.kind = "gelu_gated"
    assert (spec.routing.top_k, spec.routing.scoring, spec.activation.kind) == (6, "softmax", "gelu_gated")
    assert spec.routing.group_score == "top2_sum" and spec.routing.correction_bias


def test_spec_json_round_trips_through_a_file(tmp_path):
    spec = moekit.ModelSpec.preset("mixtral")
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    again = moekit.ModelSpec.from_json(path)
    assert again.to_json() == spec.to_json()


def test_spec_from_hf_config_file_and_dict(tmp_path):
    config = {
        "model_type": "qwen3_moe",
        "hidden_size": 64,
        "moe_intermediate_size": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "norm_topk_prob": True,
        "num_hidden_layers": 2,
        "hidden_act": "silu",
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    for source in (tmp_path, tmp_path / "config.json", config):
        spec = moekit.ModelSpec.from_hf_config(source, 1)
        assert (spec.hidden, spec.intermediate, spec.n_experts, spec.routing.top_k) == (64, 32, 8, 2)
        assert spec.routing.renormalize


def test_options_take_keywords_and_format_parameters():
    options = moekit.Options(runner="cpu", weights=moekit.Int4Group(64, zero_points=True), max_tokens=128, threads=2, strict=True)
    assert (options.runner, options.max_tokens, options.threads, options.strict) == ("cpu", 128, 2, True)
    assert options.weights.format == "int4-group" and options.weights.zero_points
    assert options.weights.block_cols == 64
    options.weights = "fp8-block"
    assert options.weights == moekit.Fp8Block(128)


@pytest.mark.parametrize(
    "make, fmt",
    [
        (lambda: moekit.Fp8Block(128), "fp8-block"),
        (lambda: moekit.Fp8Tensor("channel"), "fp8-tensor"),
        (lambda: moekit.Int4Group(64, "f16"), "int4-group"),
        (lambda: moekit.Int4GroupA8(32), "int4-group"),
        (lambda: moekit.Unquantized("f16"), "f16"),
        (lambda: moekit.QuantParams("bf16"), "bf16"),
    ],
)
def test_format_constructors(make, fmt):
    assert make().format == fmt


def test_resolve_records_every_decision_with_its_reason():
    plan = moekit.resolve(moekit.ModelSpec.preset("dsv3"), moekit.Options(weights=moekit.Fp8Block(), max_tokens=64))
    assert plan.runner in ("cpu", "cuda") and plan.form != "auto"
    layers = {d.layer for d in plan.decisions}
    assert {"1 block", "2 experts", "3 dispatcher", "4 runner", "5 quant method"} <= layers
    assert all(d.reason for d in plan.decisions if d.layer != "model")
    assert "fp8-block" in plan.explain()
    assert plan.quant == moekit.Fp8Block(128)


def test_a_fallback_is_in_the_plan_and_strict_refuses_it():
    spec = moekit.ModelSpec.preset("mixtral")  # no shared experts: nothing to overlap
    plan = moekit.resolve(spec, moekit.Options(form="overlapped"))
    assert [(d.topic, d.choice) for d in plan.fallbacks] == [("form", "standard")]
    assert "overlapped asked" in plan.fallbacks[0].fallback
    with pytest.raises(moekit.ConfigRefused, match="strict"):
        moekit.resolve(spec, moekit.Options(form="overlapped", strict=True))


def test_rejected_candidates_have_reasons():
    plan = moekit.resolve(moekit.ModelSpec.preset("mixtral"), moekit.Options(runner="cpu"), moekit.Platform.cpu_only(4))
    rejected = [r for d in plan.decisions for r in d.rejected]
    assert rejected and all(r.candidate and r.reason for r in rejected)


def test_platform_probe():
    platform = moekit.Platform.probe()
    assert platform.cpu_threads >= 1 and platform.summary()
    assert platform.cpu_vendor in platform.summary() and platform.cpu_family > 0


def test_specs_are_made_with_keywords():
    spec = moekit.ModelSpec(
        name="tiny",
        hidden=32,
        intermediate=16,
        n_experts=4,
        routing=moekit.RoutingSpec(scoring="sqrt_softplus", top_k=2, renormalize=True),
        activation=moekit.Activation.SwigluOai(),
    )
    assert (spec.hidden, spec.routing.top_k, spec.routing.scoring, spec.activation.kind) == (32, 2, "sqrt_softplus", "swiglu_oai")
    assert spec.problems() == []
    with pytest.raises(TypeError, match="no field 'hiden'"):
        moekit.ModelSpec(hiden=32)
