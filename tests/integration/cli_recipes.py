#!/usr/bin/env python3
"""cli:recipes_*: every recipe in recipes/ validates and plans as its header says, and the
CPU-sized ones train.

`validate_plan` validates each recipe exactly as shipped (in a scratch directory that holds the
repository's configs/ and data/kjv.txt, plus two small llm.c shards where gpt2-124m.yaml expects
FineWeb's), then runs `trainctl plan` on it: the large recipes name the layout the planner ranks
first for their cluster, and this checks it still does; llama3-405b.yaml's own layout (the
paper's) does not fit on the planner's 1F1B schedule without recompute, and this checks that the
planner still ranks the paper's degrees (with full recompute). A recipe missing from PLAN, or an
entry of PLAN missing from recipes/, fails the test.
`cpu_train`: the CPU-sized recipes (one per family, and llama3-tiny-bpe.yaml on a dataset made by
trainctl data prepare) train 8 steps through the binary and the loss falls."""
import json
import os
import struct

import cli_util
import tokenizer_fixtures
from cli_util import check

# What `trainctl plan RECIPE` must say, per recipe file:
#   "plans":   exit 0 with at least one ranked layout (the CPU-sized recipes plan for this machine;
#              gpt2-124m keeps llm.c's own layout, which is not the planner's first)
#   "picks":   the planner's first layout is the recipe's own parallel section and micro-batch
#   ("refused", TEXT): exit 2, naming TEXT among the reasons
#   ("ranks", DEGREES): exit 0 with a ranked layout of these degrees
PLAN = {
    "tiny.yaml": "plans",
    "llama3-tiny.yaml": "plans",
    "llama3-tiny-bpe.yaml": "plans",
    "llama3-tiny-finetune.yaml": "plans",
    "mixtral-tiny.yaml": "plans",
    "gpt2-124m.yaml": "plans",
    "llama3-8b.yaml": "picks",
    "llama3-70b.yaml": "picks",
    "mixtral-8x7b.yaml": "picks",
    "llama3-405b.yaml": ("ranks", {"tp": 8, "pp": 16, "dp": 128}),
}
CPU_SIZED = ["tiny.yaml", "llama3-tiny.yaml", "llama3-tiny-bpe.yaml", "llama3-tiny-finetune.yaml",
             "mixtral-tiny.yaml"]


def write_llmc_shard(path, tokens):
    """An llm.c version-1 shard: a 256 x int32 header (magic 20240520, version 1, token count),
    then the tokens as uint16."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def scratch_tree(binary, root, tmp):
    """A working directory in which every recipe's relative paths resolve as in the repository,
    with stand-in FineWeb shards for gpt2-124m.yaml, for llama3-tiny-bpe.yaml the dataset its
    header says to make (scripts/make-tokenizer's tokenizer, then trainctl data prepare), and for
    llama3-tiny-finetune.yaml a Hugging Face folder of llama3-tiny's shapes that transformers
    itself saved (random weights)."""
    os.symlink(os.path.join(root, "configs"), os.path.join(tmp, "configs"))
    os.makedirs(os.path.join(tmp, "data"))
    os.symlink(os.path.join(root, "data", "kjv.txt"), os.path.join(tmp, "data", "kjv.txt"))
    tokens = [(i * 7919) % 50257 for i in range(4096)]
    write_llmc_shard(os.path.join(tmp, "data", "fineweb10B", "fineweb_train_000001.bin"), tokens)
    write_llmc_shard(os.path.join(tmp, "data", "fineweb10B", "fineweb_val_000000.bin"), tokens)
    tokenizer = tokenizer_fixtures.make_llama3(root, os.path.join(tmp, "tokenizers"))
    cli_util.run_ok(binary, ["data", "prepare", "data/kjv.txt", "--tokenizer", tokenizer,
                             "--out", "data/kjv-bpe"], tmp)
    import torch
    import transformers
    transformers.logging.disable_progress_bar()
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False)).save_pretrained(os.path.join(tmp, "hf", "llama3-tiny"))


def section(dump, name):
    """The `name:` section of a resolved dump (block style, two-space indent) as {key: text}."""
    values, inside = {}, False
    for line in dump.splitlines():
        if not line.startswith(" "):
            inside = line == f"{name}:"
        elif inside and ":" in line:
            key, value = line.strip().split(":", 1)
            values[key] = value.strip().strip('"')
    return values


def validate_plan(binary, root, tmp):
    shipped = sorted(f for f in os.listdir(os.path.join(root, "recipes")) if f.endswith(".yaml"))
    check(shipped == sorted(PLAN), f"recipes/ holds {shipped}; PLAN covers {sorted(PLAN)}: "
                                   "add the new recipe's plan promise to PLAN")
    scratch_tree(binary, root, tmp)
    for name, promise in PLAN.items():
        recipe = os.path.join(root, "recipes", name)
        dump = cli_util.run_ok(binary, ["validate", recipe], tmp).stdout
        check(f'name: "{name[:-len(".yaml")]}"' in dump, f"{name}: the run is not named after "
                                                         f"its file\n{dump}")
        if promise == "plans":
            plan = json.loads(cli_util.run_ok(binary, ["plan", recipe, "--json"], tmp).stdout)
            check(plan["ranked"], f"{name}: no layout ranked\n{plan}")
        elif promise == "picks":
            plan = json.loads(cli_util.run_ok(binary, ["plan", recipe, "--json", "--top", "1"],
                                              tmp).stdout)
            p, t = section(dump, "parallel"), section(dump, "training")
            own = {"tp": int(p["tp"]), "pp": int(p["pp"]), "dp": int(p["dp"]), "ep": int(p["ep"]),
                   "cp": int(p["cp"]), "zero": int(p["zero"]), "recompute": p["recompute"],
                   "sequence_parallel": p["sequence_parallel"] == "true",
                   "pp_schedule": p["pp_schedule"], "pp_virtual": int(p["pp_virtual"]),
                   "micro_batch": int(t["micro_batch"])}
            first = plan["ranked"][0]["layout"]
            check(first == own, f"{name}: the planner now ranks {first} first, the recipe says "
                                f"{own}; update the recipe's parallel section (and its header)")
            cluster = section(dump, "cluster")
            check(plan["world"] == int(cluster["nodes"]) * int(cluster["gpus_per_node"]),
                  f"{name}: planned for {plan['world']} GPUs, not the recipe's cluster")
        elif promise[0] == "ranks":
            plan = json.loads(cli_util.run_ok(binary, ["plan", recipe, "--json", "--top", "100"],
                                              tmp).stdout)
            ranked = [{k: r["layout"][k] for k in promise[1]} for r in plan["ranked"]]
            check(promise[1] in ranked, f"{name}: {promise[1]} is not ranked: {ranked}")
        else:
            _, reason = promise
            result = cli_util.run(binary, ["plan", recipe], tmp)
            check(result.rc == 2 and reason in result.stderr,
                  f"{name}: expected exit 2 naming '{reason}'\n{result.describe()}")


def cpu_train(binary, root, tmp):
    scratch_tree(binary, root, tmp)
    for name in CPU_SIZED:
        run_dir = os.path.join(tmp, "runs", name[:-len(".yaml")])
        sets = ["training.steps=8", "schedule.warmup_steps=2", "logging.every_steps=1",
                "logging.eval_every_steps=0", "logging.eval_batches=1", "checkpoint.every_steps=0",
                "logging.tensorboard=false"]
        cli_util.run_ok(binary, ["run", os.path.join(root, "recipes", name), "--run-dir", run_dir,
                                 *[a for s in sets for a in ("--set", s)]], tmp)
        losses = [m["loss"] for m in cli_util.read_metrics(run_dir)]
        check(len(losses) == 8, f"{name}: {len(losses)} steps recorded, expected 8")
        check(losses[-1] < losses[0], f"{name}: the loss did not fall: {losses}")


if __name__ == "__main__":
    cli_util.cases_main({"validate_plan": validate_plan, "cpu_train": cpu_train}, "recipes")
