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

model.init_from, the other way (a recipe that names only the source, the data and the training:
the model keys come from the source):
`import_models`: folders transformers makes with random weights (GPT-2 tied and untied, Llama with
  GQA, Llama tied with biases in 20 KB shards, Mixtral) train in trainctl from a first loss equal to
  transformers' on the same four windows (1e-6 relative), on one rank and under tp2, pp2,
  dp2 x ZeRO-3, tp2 x pp2, ep2 and ep2 x tp2. (That the load is the export's exact inverse, bit for
  bit, is train_test's "import: trainctl -> HF -> trainctl -> HF is bit for bit".)
`import_checkpoint`: from a trainctl run directory: the first loss is the run's final val_loss on
  the same windows (fp32 and tp2), a bf16 run rounds the weights (within 2%). A fine-tune resumes
  after its source folder is gone, bit for bit as the run that never stopped; a fresh run from
  its recipe.yaml without the source is refused.
`import_bad_input`: exit 2 naming the file and the problem, no run directory: a missing path, an
  unsupported model_type, RoPE scaling, a missing tensor, a wrong shape, a tensor with no place,
  safetensors headers that lie (offsets past the end, overlapping tensors, 2^62 elements, a header
  length past the file), an unread dtype, and recipe keys that disagree with the source.
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
    problems = {k: v for k, v in info.items() if v}  # missing, unexpected, mismatched, errors
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


# ---- model.init_from -----------------------------------------------------------------------------

# Four windows of 16 tokens (65 bytes): one step of global_batch 4 sees each window once, in some
# order, so the first step's loss (computed before the update) is the mean cross-entropy of the
# initial weights over exactly these windows, which transformers computes from the same folder.
WINDOW_TEXT = cli_ckpt_export.VAL_TEXT[:65]
HF_SIZES = dict(vocab_size=256, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, rope_theta=500.0, rms_norm_eps=1e-6,
                initializer_range=0.2)


def hf_folder(kind, out, seed=0, shard=None, **config):
    """A model transformers makes with random weights (initializer_range 0.2, so every layer
    matters to the loss) and saves with save_pretrained; returns the folder."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        c = transformers.GPT2Config(vocab_size=256, n_embd=48, n_inner=64, n_layer=2, n_head=4,
                                    n_positions=16, initializer_range=0.2, **config)
        model = transformers.GPT2LMHeadModel(c)
    elif kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**HF_SIZES, **config}))
    else:
        model = transformers.MixtralForCausalLM(transformers.MixtralConfig(
            **{**HF_SIZES, "num_local_experts": 4, "num_experts_per_tok": 2, **config}))
    model.save_pretrained(out, **({"max_shard_size": shard} if shard else {}))
    return out


def windows_file(tmp):
    path = os.path.join(tmp, "windows.txt")
    with open(path, "wb") as f:
        f.write(WINDOW_TEXT)
    return path


def window_batch():
    tokens = np.frombuffer(WINDOW_TEXT, dtype=np.uint8).astype(np.int64)
    return np.stack([tokens[i * 16:i * 16 + 17] for i in range(4)])


def finetune_recipe(tmp, source, extra=""):
    """A fine-tuning recipe: the model keys come from the source; data the four windows."""
    path = os.path.join(tmp, "finetune.yaml")
    text = windows_file(tmp)
    with open(path, "w") as f:
        f.write(f"name: finetune\nmodel: {{init_from: {source}{extra}}}\n"
                f"data: {{source: text, path: {text}, val_path: {text}}}\n"
                "training: {steps: 1, global_batch: 4, micro_batch: 2}\n"
                "schedule: {warmup_steps: 1}\n"
                "precision: {compute: fp32, loss_scale: none}\n"
                "checkpoint: {every_steps: 1}\n"
                "logging: {tensorboard: false, eval_batches: 2, eval_every_steps: 0}\n")
    return path


def first_loss(binary, root, tmp, name, source, sets=(), extra="", args=()):
    run_dir = os.path.join(tmp, name)
    result = cli_util.run_ok(binary, ["run", finetune_recipe(tmp, source, extra), "--run-dir",
                                      run_dir, *[a for s in sets for a in ("--set", s)], *args],
                             root)
    check("(model.init_from), read in" in result.stderr, f"no weights line\n{result.describe()}")
    return cli_util.read_metrics(run_dir)[0]["loss"], run_dir


def check_import(binary, root, tmp, name, folder, architecture, layouts, extra=""):
    """trainctl's first loss from the folder, on one rank and under `layouts`, must be
    transformers' loss of the folder on the same windows."""
    import cli_layout_util as lu
    theirs = hf_loss(folder, window_batch(), architecture)
    report = []
    for layout in ["1", *layouts]:
        ours, _ = first_loss(binary, root, tmp, f"{name}-{layout}", folder, lu.layout_sets(layout),
                             extra)
        difference = abs(ours - theirs) / abs(theirs)
        check(difference <= RTOL, f"{name} {layout}: trainctl's first loss {ours!r} from {folder}, "
                                  f"transformers' {theirs!r} (relative {difference:.3g} > {RTOL})")
        report.append(f"{layout} {difference:.2g}")
    return f"{name}: " + ", ".join(report)


def import_models(binary, root, tmp):
    report = [
        check_import(binary, root, tmp, "gpt2", hf_folder("gpt2", os.path.join(tmp, "gpt2")),
                     "GPT2LMHeadModel", ["tp2", "pp2"]),
        check_import(binary, root, tmp, "gpt2-untied",
                     hf_folder("gpt2", os.path.join(tmp, "gpt2-untied"), tie_word_embeddings=False),
                     "GPT2LMHeadModel", []),
        check_import(binary, root, tmp, "llama", hf_folder("llama", os.path.join(tmp, "llama")),
                     "LlamaForCausalLM", ["tp2", "dp2-zero3", "tp2-pp2"], ", seq_len: 16"),
        check_import(binary, root, tmp, "llama-tied-bias",
                     hf_folder("llama", os.path.join(tmp, "llama-tied-bias"), seed=1,
                               tie_word_embeddings=True, attention_bias=True, mlp_bias=True,
                               shard="20KB"),
                     "LlamaForCausalLM", ["pp2"], ", seq_len: 16"),
        check_import(binary, root, tmp, "mixtral",
                     hf_folder("mixtral", os.path.join(tmp, "mixtral")), "MixtralForCausalLM",
                     ["ep2", "ep2-tp2"], ", seq_len: 16"),
    ]
    print("first loss against transformers (relative): " + "; ".join(report))


def import_checkpoint(binary, root, tmp):
    """model.init_from a trainctl run: the first loss is that run's final val_loss on the same
    windows (fp32, and under tp2); a bf16 run from the fp32 checkpoint rounds the weights."""
    text = windows_file(tmp)
    source = train(binary, root, tmp, "source", ["model.kv_heads=4", *SMALL,
                                                 "data.path=" + text, "data.val_path=" + text,
                                                 "logging.eval_batches=2"])
    want = cli_util.read_metrics(source)[-1]["val_loss"]
    for name, sets, tolerance in [("fp32", [], RTOL), ("tp2", ["parallel.tp=2"], RTOL),
                                  ("bf16", ["precision.compute=bf16"], 2e-2)]:
        ours, _ = first_loss(binary, root, tmp, name, source, sets, ", seq_len: 16")
        check(abs(ours - want) <= tolerance * abs(want),
              f"init_from a checkpoint ({name}): first loss {ours!r}, its final val_loss {want!r}")
    # A resume reads its own checkpoints: the source may be gone (its resolved recipe.yaml sets
    # every model key), and continues as the run that never stopped; a fresh run from that
    # recipe needs the source and is refused before anything is created.
    folder = hf_folder("llama", os.path.join(tmp, "llama"))
    _, straight = first_loss(binary, root, tmp, "straight", folder, ["training.steps=2"],
                             ", seq_len: 16")
    _, stopped = first_loss(binary, root, tmp, "stopped", folder, [], ", seq_len: 16")
    os.rename(folder, folder + "-gone")
    cli_util.run_ok(binary, ["resume", stopped, "--set", "training.steps=2"], root)
    check([m["loss"] for m in cli_util.read_metrics(stopped)] ==
          [m["loss"] for m in cli_util.read_metrics(straight)],
          "the resumed fine-tune parts from the straight one")
    cli_util.check_refused(binary, ["run", os.path.join(stopped, "recipe.yaml"), "--run-dir",
                                    os.path.join(tmp, "fresh")], root,
                           "no such file or directory", os.path.join(tmp, "fresh"))
    print(f"from a trainctl run: first loss equals its val_loss {want:.6f} (fp32, tp2), bf16 "
          "within 2%; a fine-tune resumes without its source")


def import_bad_input(binary, root, tmp):
    """Exit 2 naming the file and the problem, and no run directory."""
    import safetensors.numpy
    run_dir = os.path.join(tmp, "run")
    llama = hf_folder("llama", os.path.join(tmp, "llama"))
    weights = safetensors.numpy.load_file(os.path.join(llama, "model.safetensors"))

    def refused(source, words, sets=()):
        cli_util.check_refused(binary, ["run", finetune_recipe(tmp, source, ", seq_len: 16"),
                                        "--run-dir", run_dir,
                                        *[a for s in sets for a in ("--set", s)]],
                               root, words, run_dir)

    def variant(name, config=None, tensors=None, raw=None):
        folder = os.path.join(tmp, name)
        os.makedirs(folder)
        with open(os.path.join(llama, "config.json")) as f:
            c = json.load(f)
        c.update(config or {})
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(c, f)
        if raw is not None:
            with open(os.path.join(folder, "model.safetensors"), "wb") as f:
                f.write(raw)
        else:
            safetensors.numpy.save_file(tensors if tensors is not None else weights,
                                        os.path.join(folder, "model.safetensors"))
        return folder

    def header(entries, data=b""):
        text = json.dumps(entries).encode()
        return len(text).to_bytes(8, "little") + text + data

    refused(os.path.join(tmp, "nowhere"), "no such file or directory")
    refused(variant("bert", {"model_type": "bert"}), 'model_type "bert"')
    refused(variant("scaling", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}),
            'rope_type "yarn"')
    missing = dict(weights)
    del missing["model.layers.1.mlp.up_proj.weight"]
    refused(variant("missing", tensors=missing), "no tensor model.layers.1.mlp.up_proj.weight")
    refused(variant("shape", {"intermediate_size": 96}), "has shape [48, 64], but a model of this config needs [48, 96]")
    extra = dict(weights, **{"model.layers.2.mlp.up_proj.weight": np.zeros((4,), np.float32)})
    refused(variant("extra", tensors=extra), "has no place in the model")
    refused(variant("past_end", raw=header({"a": {"dtype": "F32", "shape": [4],
                                                  "data_offsets": [0, 16]}}, b"\0" * 8)),
            "do not hold its 16 bytes")
    refused(variant("overlap", raw=header({
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, b"\0" * 24)), "overlap")
    refused(variant("huge", raw=header({"a": {"dtype": "F32", "shape": [2 ** 31, 2 ** 31],
                                              "data_offsets": [0, 16]}}, b"\0" * 16)),
            "more than 2^62 bytes")
    refused(variant("length", raw=(10 ** 12).to_bytes(8, "little") + b"{}"),
            "past the file's end")
    refused(variant("int8", raw=header({"a": {"dtype": "I8", "shape": [4],
                                              "data_offsets": [0, 4]}}, b"\0" * 4)),
            'dtype "I8" is not read')
    # The recipe against the source: both values named, and the way out.
    refused(llama, "model.hidden is 64 here but 48 in", ["model.hidden=64"])
    refused(llama, "model.kv_heads is 4 here but 2 in", ["model.kv_heads=4"])
    print("13 refusals, no run directory")


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
    for size in ("0", "5XB", "-1", "99999999999GiB"):
        refused(gpt, "--max-shard-size", extra=("--max-shard-size", size))
    print("7 refusals, nothing written")


if __name__ == "__main__":
    cli_util.cases_main({"gpt2": gpt2, "llama": llama, "mixtral": mixtral,
                         "mixtral_layouts": mixtral_layouts, "tokenizer": tokenizer,
                         "bad_input": bad_input, "import_models": import_models,
                         "import_checkpoint": import_checkpoint,
                         "import_bad_input": import_bad_input}, "hf")
