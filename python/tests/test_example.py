"""python/examples/qwen3_moe_generate.py: a Qwen3-MoE model with moekit's MoE blocks generates the
same tokens as with transformers' own."""

import importlib.util
import pathlib

from conftest import needs_transformers

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "qwen3_moe_generate.py"


@needs_transformers
def test_example_generates_the_same_tokens(capsys):
    spec = importlib.util.spec_from_file_location("qwen3_moe_generate", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # in this process: torch and transformers are imported once
    assert example.main(["--tokens", "4"]) == 0
    assert "the same tokens" in capsys.readouterr().out
