"""python/examples/qwen3_moe_generate.py: a Qwen3-MoE model with moekit's MoE blocks generates the
same tokens as with transformers' own."""

import pathlib
import subprocess
import sys

from conftest import needs_transformers

EXAMPLE = pathlib.Path(__file__).parents[1] / "examples" / "qwen3_moe_generate.py"


@needs_transformers
def test_example_generates_the_same_tokens():
    run = subprocess.run([sys.executable, str(EXAMPLE), "--tokens", "8"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "the same tokens" in run.stdout
