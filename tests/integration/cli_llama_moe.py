#!/usr/bin/env python3
"""cli:llama_moe_runs: the Llama-style MoE fixture (tests/fixtures/recipes/llama_moe.yaml: RMSNorm,
SwiGLU, RoPE, grouped-query attention, untied head, MoE every 2nd layer, fp32, synthetic data)
trains 10 steps and its loss falls; the run reports one expert-load row per MoE layer."""
import math
import os

import cli_util
from cli_util import check

FIXTURE = os.path.join("tests", "fixtures", "recipes", "llama_moe.yaml")


def main(binary, root):
    with cli_util.temp_dir("llama-moe") as tmp:
        run_dir = os.path.join(tmp, "run")
        result = cli_util.run_ok(binary, ["run", FIXTURE, "--run-dir", run_dir], root)
        # The model that was built is the one the recipe describes (the model line names it).
        model_line = [l for l in result.stderr.splitlines() if l.startswith("model: ")]
        check(len(model_line) == 1, f"expected one 'model:' line\n{result.describe()}")
        for word in ("4 layers", "4 heads (2 kv)", "rmsnorm", "swiglu", "rope", "moe 4x top-2",
                     "f32"):
            check(word in model_line[0], f"model line lacks '{word}': {model_line[0]}")

        records = cli_util.read_metrics(run_dir)
        check([r["step"] for r in records] == list(range(1, 11)),
              f"expected steps 1..10, got {[r['step'] for r in records]}")
        losses = [r["loss"] for r in records]
        check(all(isinstance(x, float) and math.isfinite(x) for x in losses),
              f"non-finite loss: {losses}")
        # Uniform over 256 byte values is ln 256 = 5.545; 10 steps must learn something.
        check(abs(losses[0] - math.log(256)) < 0.3, f"first loss {losses[0]} is not near ln 256")
        check(losses[-1] < losses[0] - 0.1, f"loss did not fall: first {losses[0]}, last "
              f"{losses[-1]}")
        for r in records:
            load = r.get("expert_load")
            check(isinstance(load, list) and len(load) == 2,
                  f"step {r['step']}: expected expert_load for the 2 MoE layers (1 and 3), got "
                  f"{load}")
            for layer in load:
                check(len(layer) == 4 and abs(sum(layer) - 1.0) < 1e-6,
                      f"step {r['step']}: expert loads {layer} do not sum to 1 over 4 experts")
        # No TensorBoard file was asked for (logging.tensorboard: false).
        events = [n for n in os.listdir(run_dir) if n.startswith("events.out.tfevents")]
        check(not events, f"logging.tensorboard: false but found {events}")
        summary = cli_util.read_summary(run_dir)
        check(summary["steps"] == 10, f"summary steps {summary['steps']} != 10")
        print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
