#!/usr/bin/env python3
"""cli:hf_*: `trainctl ckpt export RUN --format hf --out DIR` writes a folder that transformers'
own `AutoModelForCausalLM.from_pretrained(DIR)` loads as it is (no missing, unexpected or
mismatched tensor), and the model it builds computes trainctl's loss: the final evaluation's
val_loss of the run (computed on the weights the last checkpoint saves) equals transformers' mean
cross-entropy on the same validation windows to 1e-6 relative, in fp32.

`gpt2`: GPT2LMHeadModel, tied and untied head; the tied run also exported in shards of at most
  20 KB with model.safetensors.index.json, which loads to the same loss.
`llama`: LlamaForCausalLM with grouped-query attention (4 heads on 2), untied; tied; with biases
  (attention_bias, mlp_bias); RoPE theta and RMSNorm epsilon off their defaults.
`mixtral`: MixtralForCausalLM: moe.router softmax_topk_renorm with capacity_factor 0 (Mixtral's
  router, which never drops a token), 4 experts top-2 on every layer.
`mixtral_layouts`: that router trains under ep2 x tp2, ep2 x dp2 with ZeRO-2 and tp2 x pp2 as on
  one rank (cli:layouts' tolerance: losses, gradient norms, weights).
`tokenizer`: a run on data prepared with a byte-level BPE tokenizer.json: the folder carries that
  file byte for byte, AutoTokenizer loads it and encodes as the tokenizers library does, and
  config.json's bos/eos ids are the end-of-document id.
`bad_input`: exit 2 naming the problem, and no folder (nor a temporary one) is left: a model no HF
  class computes (gpt without biases), MoE on every 2nd layer, Mixtral with the softmax router or
  with token dropping, an existing folder (left as it was), a bad --max-shard-size.
"""
import json
import os

import numpy as np

import cli_ckpt_export
import cli_util
import read_safetensors
from cli_util import check

try:
    import torch
    import transformers
except ImportError:
    print("torch and transformers are missing: run scripts/setup --tests (TRAINCTL_TEST_PYTHON)")
    raise

torch.set_num_threads(1)
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

SEQ = 16
JUDGED = ["logging.eval_batches=3", "training.micro_batch=2", "training.global_batch=4",
          f"model.seq_len={SEQ}", "model.init_std=0.2", "precision.loss_scale=none",
          "precision.compute=fp32", "logging.tensorboard=false", "schedule.warmup_steps=1"]
SMALL = ["model.layers=2", "model.hidden=48", "model.heads=4", "model.ffn_hidden=64"]
LLAMA = ["model.arch=llama", *SMALL, "model.kv_heads=2", "model.rope_theta=500",
         "model.norm_eps=1e-6"]
RTOL = 1e-6


def train(binary, root, tmp, name, sets, recipe="recipes/tiny.yaml"):
    val = os.path.join(tmp, "val.txt")
    if not os.path.exists(val):
        with open(val, "wb") as f:
            f.write(cli_ckpt_export.VAL_TEXT)
    run_dir = os.path.join(tmp, name)
    cli_ckpt_export.train(binary, root, run_dir, recipe, ["data.val_path=" + val, *JUDGED, *sets])
    return run_dir


def export(binary, root, run_dir, out, *extra):
    result = cli_util.run_ok(binary, ["ckpt", "export", run_dir, "--format", "hf", "--out", out,
                                      *extra], root)
    check(f"to {out} for transformers." in result.stdout, f"no export line\n{result.describe()}")
    return result


def hf_loss(folder, windows, architecture):
    """transformers' mean cross-entropy of the folder's model on the windows, in float64 from
    its fp32 logits."""
    model, info = transformers.AutoModelForCausalLM.from_pretrained(folder,
                                                                   output_loading_info=True)
    check(type(model).__name__ == architecture, f"{folder}: loads as {type(model).__name__}")
    problems = {k: v for k, v in info.items() if v and k != "error_msgs" or
                k == "error_msgs" and v}
    check(not problems, f"{folder}: from_pretrained reports {problems}")
    check(model.dtype == torch.float32, f"{folder}: loads as {model.dtype}")
    model.eval()
    tokens = torch.tensor(windows)
    with torch.no_grad():
        logits = model(input_ids=tokens[:, :-1]).logits.double()
    return float(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                   tokens[:, 1:].reshape(-1)))


def judge(run_dir, folder, architecture):
    """transformers' loss of the exported folder must be the run's final val_loss."""
    logged = cli_util.read_metrics(run_dir)[-1]
    check(logged.get("step") == 2 and "val_loss" in logged, f"no final val_loss in {logged}")
    ours = logged["val_loss"]
    theirs = hf_loss(folder, cli_ckpt_export.val_windows(os.path.join(os.path.dirname(run_dir),
                                                                      "val.txt"), SEQ, 2, 3),
                     architecture)
    difference = abs(theirs - ours) / abs(ours)
    check(difference <= RTOL,
          f"{folder}: transformers computes loss {theirs!r}, trainctl logged val_loss {ours!r} "
          f"for the same weights (relative difference {difference:.3g} > {RTOL})")
    return difference


def config(folder):
    with open(os.path.join(folder, "config.json")) as f:
        return json.load(f)


def gpt2(binary, root, tmp):
    gpt = ["model.kv_heads=4", *SMALL]
    differences = []
    for name, sets in [("tied", gpt), ("untied", [*gpt, "model.tied_embeddings=false"])]:
        run_dir = train(binary, root, tmp, name, sets)
        folder = os.path.join(tmp, name + "-hf")
        result = export(binary, root, run_dir, folder)
        check("transformers.GPT2LMHeadModel" in result.stdout and
              "files: config.json, generation_config.json, model.safetensors" in result.stdout,
              result.describe())
        c = config(folder)
        check(c["n_inner"] == 64 and c["activation_function"] == "gelu_new" and
              c["tie_word_embeddings"] == (name == "tied") and c["dtype"] == "float32", str(c))
        differences.append(judge(run_dir, folder, "GPT2LMHeadModel"))
    # The tied run again, in files of at most 20 KB with an index.
    sharded = os.path.join(tmp, "sharded-hf")
    export(binary, root, os.path.join(tmp, "tied"), sharded, "--max-shard-size", "20KB")
    with open(os.path.join(sharded, "model.safetensors.index.json")) as f:
        index = json.load(f)
    shards = sorted(set(index["weight_map"].values()))
    check(len(shards) >= 3 and not os.path.exists(os.path.join(sharded, "model.safetensors")),
          f"shards {shards}")
    for shard in shards:  # at most 20 KB of data, unless one tensor is larger on its own
        names = [n for n, s in index["weight_map"].items() if s == shard]
        _, raw = read_safetensors.read_safetensors_raw(os.path.join(sharded, shard))
        data = sum(a.nbytes for _, _, a in raw.values())
        check(sorted(raw) == sorted(names) and (data <= 20000 or len(names) == 1),
              f"{shard}: {data} bytes in {sorted(raw)}, the index says {names}")
    check(index["metadata"]["total_size"] == sum(
        a.nbytes for s in shards for _, _, a in
        read_safetensors.read_safetensors_raw(os.path.join(sharded, s))[1].values()), "total_size")
    differences.append(judge(os.path.join(tmp, "tied"), sharded, "GPT2LMHeadModel"))
    print(f"gpt2 tied, untied, tied in {len(shards)} shards: relative differences "
          f"{', '.join(f'{d:.2g}' for d in differences)}")


def llama(binary, root, tmp):
    differences = []
    for name, sets in [("gqa", LLAMA), ("tied", [*LLAMA, "model.tied_embeddings=true"]),
                       ("bias", [*LLAMA, "model.bias=true"])]:
        run_dir = train(binary, root, tmp, name, sets)
        folder = os.path.join(tmp, name + "-hf")
        export(binary, root, run_dir, folder)
        c = config(folder)
        check(c["num_key_value_heads"] == 2 and c["rms_norm_eps"] == 1e-6 and
              c["rope_parameters"]["rope_theta"] == 500 and
              c["attention_bias"] == (name == "bias") and
              c["tie_word_embeddings"] == (name == "tied"), str(c))
        differences.append(judge(run_dir, folder, "LlamaForCausalLM"))
    print(f"llama gqa, tied, bias: relative differences "
          f"{', '.join(f'{d:.2g}' for d in differences)}")


MIXTRAL = [*LLAMA, "moe.experts=4", "moe.top_k=2", "moe.every=1", "moe.capacity_factor=0",
           "moe.router=softmax_topk_renorm"]


def mixtral(binary, root, tmp):
    run_dir = train(binary, root, tmp, "moe", MIXTRAL)
    folder = os.path.join(tmp, "moe-hf")
    export(binary, root, run_dir, folder)
    c = config(folder)
    check(c["num_local_experts"] == 4 and c["num_experts_per_tok"] == 2 and
          c["intermediate_size"] == 64, str(c))
    difference = judge(run_dir, folder, "MixtralForCausalLM")
    print(f"mixtral (4 experts, top-2, renormalised): relative difference {difference:.2g}")


def mixtral_layouts(binary, root, tmp):
    """The renormalised router under expert, tensor, data (ZeRO-2) and pipeline parallelism:
    every layout within cli:layouts' tolerance of one rank, losses, gradient norms and weights."""
    import cli_layout_util as lu
    steps = 10
    reference = os.path.join(tmp, "1")
    lu.train(binary, root, reference, "mixtral", "1", steps)
    weights = lu.final_weights(binary, root, reference)
    report = []
    for layout in ("ep2-tp2", "ep2-dp2-zero2", "tp2-pp2"):
        run_dir = os.path.join(tmp, layout)
        lu.train(binary, root, run_dir, "mixtral", layout, steps)
        loss_error = lu.check_losses(reference, run_dir, layout, 1, steps, grad_norm=True)
        weight_error, _ = lu.check_weights(weights, lu.final_weights(binary, root, run_dir),
                                           layout)
        report.append(f"{layout} loss {loss_error:.2g} weights {weight_error:.2g}")
    print("mixtral router against one rank: " + "; ".join(report))


def tokenizer(binary, root, tmp):
    import tokenizer_fixtures
    from tokenizers import Tokenizer
    source = tokenizer_fixtures.make_gpt2(root, os.path.join(tmp, "tok"))
    cli_util.run_ok(binary, ["data", "prepare", os.path.join(root, "data", "kjv.txt"),
                             "--tokenizer", source, "--out", os.path.join(tmp, "kjv"),
                             "--progress", "none"], root)
    run_dir = train(binary, root, tmp, "bpe",
                    [*LLAMA, "model.vocab=3072", "data.source=megatron",
                     "data.path=" + os.path.join(tmp, "kjv"), "data.val_path="])
    folder = os.path.join(tmp, "bpe-hf")
    result = export(binary, root, run_dir, folder)
    check("tokenizer.json, tokenizer_config.json" in result.stdout, result.describe())
    with open(source, "rb") as a, open(os.path.join(folder, "tokenizer.json"), "rb") as b:
        check(a.read() == b.read(), "tokenizer.json is not the file the data was made with")
    reference = Tokenizer.from_file(source)
    eod = reference.token_to_id("<|endoftext|>")
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    text = "In the beginning God created the heaven and the earth.\n Crème brûlée 123"
    ids = hf(text, add_special_tokens=False)["input_ids"]
    check(ids == reference.encode(text, add_special_tokens=False).ids,
          f"AutoTokenizer encodes {ids}")
    check(hf.eos_token_id == eod and config(folder)["eos_token_id"] == eod, "eos id")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    check(model.generation_config.eos_token_id == eod, "generation_config eos")
    print(f"tokenizer.json carried, {len(ids)} ids as the tokenizers library encodes them, eos "
          f"{eod}")


def bad_input(binary, root, tmp):
    def refused(run_dir, words, out=None, extra=()):
        out = out or os.path.join(tmp, "out")
        before = sorted(os.listdir(tmp))
        result = cli_util.run(binary, ["ckpt", "export", run_dir, "--format", "hf", "--out", out,
                                       *extra], root)
        check(result.rc == 2 and words in result.stderr,
              f"expected exit 2 and {words!r}\n{result.describe()}")
        check(sorted(os.listdir(tmp)) == before, f"left {sorted(set(os.listdir(tmp)) - set(before))}")

    nobias = train(binary, root, tmp, "nobias", ["model.kv_heads=4", *SMALL, "model.bias=false"])
    refused(nobias, "no Hugging Face architecture computes this model")
    moe = [*LLAMA, "moe.experts=4", "moe.top_k=2"]
    refused(train(binary, root, tmp, "every2", [*moe, "moe.every=2", "moe.capacity_factor=0",
                                                "moe.router=softmax_topk_renorm"]),
            "MoE on every 2 layers")
    refused(train(binary, root, tmp, "softmax", [*moe, "moe.every=1", "moe.capacity_factor=0"]),
            "the router is moe.router softmax with moe.capacity_factor 0")
    refused(train(binary, root, tmp, "drops", [*moe, "moe.every=1",
                                               "moe.router=softmax_topk_renorm"]),
            "never drops a token")
    existing = os.path.join(tmp, "existing")
    os.makedirs(existing)
    with open(os.path.join(existing, "keep.txt"), "w") as f:
        f.write("mine")
    refused(nobias, "exists; a Hugging Face export writes a new folder", out=existing)
    check(os.listdir(existing) == ["keep.txt"], "the existing folder was touched")
    gpt = train(binary, root, tmp, "gpt", ["model.kv_heads=4", *SMALL])
    for size in ("0", "5XB", "-1"):
        refused(gpt, "--max-shard-size", extra=("--max-shard-size", size))
    print("6 refusals, nothing written")


if __name__ == "__main__":
    cli_util.cases_main({"gpt2": gpt2, "llama": llama, "mixtral": mixtral,
                         "mixtral_layouts": mixtral_layouts, "tokenizer": tokenizer,
                         "bad_input": bad_input}, "hf")
