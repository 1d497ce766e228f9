"""ModelSpec.from_hf_config: a Hugging Face config read by moekit's own config reader."""

import json
import os


def _config_text(config):
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        with open(path, encoding="utf-8") as f:
            return f.read(), path
    if isinstance(config, dict):
        return json.dumps(config), "config"
    if hasattr(config, "to_json_string"):  # a transformers PretrainedConfig
        fields = json.loads(config.to_json_string(use_diff=False))
        # A config made in memory has no dtype yet (null); saved, it would have one.
        for key in ("dtype", "torch_dtype"):
            if key in fields and fields[key] is None:
                del fields[key]
        # transformers 5 writes some keys under its own names (Qwen3-MoE's num_experts as
        # num_local_experts); the hub's names, which moekit's reader follows, are the aliases.
        for alias in getattr(config, "attribute_map", {}):
            if alias not in fields and isinstance(getattr(config, alias, None), (int, float, bool, str)):
                fields[alias] = getattr(config, alias)
        return json.dumps(fields), type(config).__name__
    raise TypeError(
        "config: expected a model directory, a config.json path, a dict or a transformers "
        f"config, got {type(config).__name__}"
    )


def from_hf_config(config, layer=None):
    """The spec of MoE layer `layer` (the first MoE layer by default) of a Hugging Face config:
    a model directory, a config.json path, a dict, or a transformers PretrainedConfig. A dense
    layer, or a setting of the MoE layer that moekit does not compute, raises ValueError naming
    it."""
    from . import _moekit

    text, label = _config_text(config)
    return _moekit.ModelSpec._from_hf_config_text(text, layer, label)

