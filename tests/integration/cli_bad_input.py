#!/usr/bin/env python3
"""cli:bad_input: malformed recipes and command lines fail with exit code 2, the exact messages
(file:line:col, what is wrong, what to do) and nothing created on disk.

Each case writes its recipe files into a fresh directory, runs trainctl there (so every relative
path, including the default run directory runs/<name>, lands inside it) and then compares the
directory tree with the one from before: a bad input must not create a single file or folder.
`run` is tried twice, with --run-dir and without (default run directory), `validate` once.
"{cwd}" in an expected message stands for that directory (relative data paths are taken from it).
"""
import os

import cli_util
from cli_util import check

SYNTHETIC = "data: {source: synthetic}\n"
SECTIONS = ("model, moe, parallel, precision, optimizer, schedule, data, training, "
            "checkpoint, stability, determinism, logging, cluster, slurm ('name' is the only "
            "top-level key)")
# tiny.yaml reads data/kjv.txt: its cases get a small stand-in (they fail before reading it).
TINY_DATA = "In the beginning God created the heaven and the earth.\n"


def recipe_case(name, text, expected, commands=("run", "validate"), args=()):
    """A recipe r.yaml with one (or more) problems; `expected` is the whole stderr."""
    return {"name": name, "files": {"r.yaml": text}, "recipe": "r.yaml", "args": list(args),
            "commands": commands, "stderr": expected}


def tiny_case(name, sets, expected, commands=("run", "validate"), extra=()):
    """recipes/tiny.yaml (copied as tiny.yaml, with data/kjv.txt) with --set overrides and `extra`
    arguments."""
    args = [a for s in sets for a in ("--set", s)] + list(extra)
    return {"name": name, "files": {}, "tiny": True, "recipe": "tiny.yaml", "args": args,
            "commands": commands, "stderr": expected}


def one(message, file="r.yaml"):
    return f"{message}\n1 problem in {file}\n"


CASES = [
    # ---- YAML and structure ----
    recipe_case("yaml_syntax", "name: bad\nmodel: [\n",
                one("r.yaml:3:1: error: YAML syntax error: end of sequence flow not found")),
    recipe_case("yaml_tab_indent", "\tname: bad\n",
                one("r.yaml:1:1: error: tabs are not allowed for YAML indentation; indent with "
                    "spaces")),
    recipe_case("yaml_tab_indent_in_section", "name: bad\n" + SYNTHETIC + "model:\n  layers: 2\n"
                "\theads: 2\n",
                one("r.yaml:5:1: error: tabs are not allowed for YAML indentation; indent with "
                    "spaces")),
    recipe_case("top_level_list", "- a\n- b\n",
                one("r.yaml:1:1: error: a recipe is a map of sections "
                    "(name:, model:, training:, ...)")),
    recipe_case("empty_file", "",
                "r.yaml: error: missing required key 'name' (run name; used as the run directory "
                "name); add e.g. `name: my-run`\n"
                "r.yaml: error: data.path (or data.sources) is required when data.source is text "
                "(or use data.source: synthetic)\n2 problems in r.yaml\n"),
    recipe_case("unknown_section", "name: bad\n" + SYNTHETIC + "modle: {layers: 2}\n",
                one("r.yaml:3:1: error: unknown section 'modle'; did you mean 'model'?")),
    recipe_case("unknown_section_no_guess", "name: bad\n" + SYNTHETIC + "zzzzzz: 1\n",
                one(f"r.yaml:3:1: error: unknown section 'zzzzzz'; the sections are: {SECTIONS}")),
    recipe_case("unknown_key", "name: bad\n" + SYNTHETIC + "model: {layers: 2, hiden: 64}\n",
                one("r.yaml:3:20: error: unknown key 'model.hiden'; did you mean 'model.hidden'?")),
    recipe_case("section_not_a_map", "name: bad\n" + SYNTHETIC + "model: 5\n",
                one("r.yaml:3:8: error: section 'model' must be a map of keys, e.g. "
                    "`model: {key: value}`")),
    recipe_case("duplicate_section", "name: bad\n" + SYNTHETIC + "model: {layers: 2}\n"
                "model: {heads: 2}\n",
                one("r.yaml:4:1: error: duplicate section 'model' (first at line 3); merge them")),
    recipe_case("duplicate_name", "name: bad\n" + SYNTHETIC + "name: again\n",
                one("r.yaml:3:1: error: duplicate key 'name' (first at line 1); keep one")),
    recipe_case("unknown_top_level_key", "name: bad\n" + SYNTHETIC + "nmae: x\n",
                one("r.yaml:3:1: error: unknown top-level key 'nmae'; did you mean 'name'?")),
    recipe_case("duplicate_key", "name: bad\n" + SYNTHETIC + "model: {layers: 2, layers: 3}\n",
                one("r.yaml:3:20: error: duplicate key 'model.layers' (first at line 3); "
                    "keep one")),
    recipe_case("missing_name", SYNTHETIC + "model: {layers: 2}\n",
                one("r.yaml: error: missing required key 'name' (run name; used as the run "
                    "directory name); add e.g. `name: my-run`")),
    recipe_case("bad_name", 'name: "a b"\n' + SYNTHETIC,
                one("r.yaml:1:7: error: name: 'a b' may only use letters, digits, '.', '_' and "
                    "'-' (it names the run directory)")),
    # ---- types and ranges ----
    recipe_case("wrong_type_integer", "name: bad\n" + SYNTHETIC + "model: {layers: two}\n",
                one("r.yaml:3:17: error: model.layers: expected an integer, got 'two'")),
    recipe_case("wrong_type_fraction", "name: bad\n" + SYNTHETIC + "model: {layers: 2.5}\n",
                one("r.yaml:3:17: error: model.layers: expected an integer, got '2.5'")),
    recipe_case("wrong_type_bool", "name: bad\n" + SYNTHETIC + "logging: {tensorboard: maybe}\n",
                one("r.yaml:3:24: error: logging.tensorboard: expected true or false, "
                    "got 'maybe'")),
    recipe_case("bad_enum", "name: bad\n" + SYNTHETIC + "precision: {compute: fp12}\n",
                one("r.yaml:3:22: error: precision.compute: expected one of fp32 | bf16 | fp16 | "
                    "fp64, got 'fp12'; did you mean 'fp32'?")),
    recipe_case("betas_length", "name: bad\n" + SYNTHETIC + "optimizer: {betas: [0.9]}\n",
                one("r.yaml:3:20: error: optimizer.betas: expected a list of 2 numbers like "
                    "[0.9, 0.95], got 1 item")),
    recipe_case("below_range", "name: bad\n" + SYNTHETIC + "model: {layers: 0}\n",
                one("r.yaml:3:17: error: model.layers: must be >= 1, got 0")),
    recipe_case("not_positive", "name: bad\n" + SYNTHETIC + "optimizer: {lr: -1}\n",
                one("r.yaml:3:17: error: optimizer.lr: must be > 0, got -1")),
    recipe_case("above_range", "name: bad\ndata: {source: synthetic, val_fraction: 0.9}\n",
                one("r.yaml:2:41: error: data.val_fraction: must be in [0, 0.5], got 0.9")),
    recipe_case("integer_overflow", "name: bad\n" + SYNTHETIC + "model: {layers: 99999999999}\n",
                one("r.yaml:3:17: error: model.layers: must be <= 2147483647, got 99999999999")),
    recipe_case("negative_loss_scale", "name: bad\n" + SYNTHETIC + "precision: {loss_scale: -2}\n",
                one("r.yaml:3:25: error: precision.loss_scale: a static loss scale must be > 0, "
                    "got -2")),
    # ---- cross-field rules ----
    recipe_case("hidden_heads", "name: bad\n" + SYNTHETIC + "model: {hidden: 130, heads: 4}\n",
                one("r.yaml:3:29: error: model.hidden % model.heads == 0 fails: 130 % 4 = 2 "
                    "(head_dim = hidden / heads must be whole)")),
    recipe_case("kv_heads_above_heads", "name: bad\n" + SYNTHETIC +
                "model: {heads: 4, kv_heads: 8}\n",
                one("r.yaml:3:29: error: model.kv_heads <= model.heads fails: 8 > 4")),
    recipe_case("heads_kv_heads", "name: bad\n" + SYNTHETIC + "model: {heads: 4, kv_heads: 3}\n",
                one("r.yaml:3:29: error: model.heads % model.kv_heads == 0 fails: 4 % 3 = 1 "
                    "(each key/value head serves a whole group of query heads)")),
    recipe_case("rope_odd_head_dim", "name: bad\n" + SYNTHETIC +
                "model: {arch: llama, hidden: 12, heads: 4}\n",
                one("r.yaml:3:30: error: head_dim = model.hidden / model.heads = 12 / 4 = 3 must "
                    "be even with model.position: rope")),
    recipe_case("global_batch_micro_batch", "name: bad\n" + SYNTHETIC +
                "training: {global_batch: 10, micro_batch: 4}\n",
                one("r.yaml:3:26: error: training.global_batch % (training.micro_batch * "
                    "parallel.dp * parallel.ep) == 0 fails: 10 % (4 * 1 * 1) = 10 % 4 = 2")),
    recipe_case("top_k_above_experts", "name: bad\n" + SYNTHETIC + "moe: {experts: 2, top_k: 3}\n",
                one("r.yaml:3:26: error: moe.top_k <= moe.experts fails: 3 > 2")),
    recipe_case("ep_without_experts", "name: bad\n" + SYNTHETIC + "parallel: {ep: 2}\n",
                one("r.yaml:3:16: error: parallel.ep = 2 needs an MoE model (moe.experts > 0), "
                    "but moe.experts = 0")),
    recipe_case("min_lr_above_lr", "name: bad\n" + SYNTHETIC +
                "optimizer: {lr: 1e-3}\nschedule: {min_lr: 1e-2}\n",
                one("r.yaml:4:20: error: schedule.min_lr <= optimizer.lr fails: 0.01 > 0.001")),
    recipe_case("warmup_above_steps", "name: bad\n" + SYNTHETIC +
                "training: {steps: 5}\nschedule: {warmup_steps: 10}\n",
                one("r.yaml:4:26: error: schedule.warmup_steps <= training.steps fails: 10 > 5")),
    recipe_case("text_without_path", "name: bad\ndata: {source: text}\n",
                one("r.yaml:2:16: error: data.path (or data.sources) is required when "
                    "data.source is text (or use data.source: synthetic)")),
    recipe_case("every_problem_at_once", "name: bad\n" + SYNTHETIC +
                "model: {layers: 0, hidden: 130}\nmoe: {experts: 2, top_k: 3}\nfoo: 1\n",
                "r.yaml:3:17: error: model.layers: must be >= 1, got 0\n"
                "r.yaml:3:28: error: model.hidden % model.heads == 0 fails: 130 % 4 = 2 "
                "(head_dim = hidden / heads must be whole)\n"
                "r.yaml:4:26: error: moe.top_k <= moe.experts fails: 3 > 2\n"
                f"r.yaml:5:1: error: unknown section 'foo'; the sections are: {SECTIONS}\n"
                "4 problems in r.yaml\n"),
    # ---- --set overrides ----
    tiny_case("set_unknown_key", ["model.layrs=2"],
              one("error: --set model.layrs=2: unknown key 'model.layrs'; did you mean "
                  "'model.layers'?", "tiny.yaml")),
    tiny_case("set_bad_value", ["model.layers=abc"],
              one("error: --set model.layers=abc: expected an integer, got 'abc'", "tiny.yaml")),
    tiny_case("set_empty_value", ["model.layers="],
              one("error: --set model.layers=: expected an integer, got nothing", "tiny.yaml")),
    tiny_case("set_out_of_range", ["model.layers=0"],
              one("error: --set model.layers=0: must be >= 1, got 0", "tiny.yaml")),
    tiny_case("set_without_equals", ["foo"],
              one("error: --set foo: expected KEY=VALUE, e.g. --set model.layers=8", "tiny.yaml")),
    tiny_case("set_section", ["model=3"],
              one("error: --set model=3: 'model' is a section; set one key, e.g. "
                  "--set model.KEY=VALUE", "tiny.yaml")),
    tiny_case("set_top_k_above_experts", ["moe.experts=2", "moe.top_k=3"],
              one("error: --set moe.top_k=3: moe.top_k <= moe.experts fails: 3 > 2", "tiny.yaml")),
    tiny_case("set_heads_breaks_file_keys", ["model.heads=3"],
              "error: --set model.heads=3: model.hidden % model.heads == 0 fails: 128 % 3 = 2 "
              "(head_dim = hidden / heads must be whole)\n"
              "error: --set model.heads=3: model.kv_heads <= model.heads fails: 4 > 3\n"
              "2 problems in tiny.yaml\n"),
    tiny_case("set_micro_batch_breaks_file_batch", ["training.micro_batch=3"],
              one("error: --set training.micro_batch=3: training.global_batch % "
                  "(training.micro_batch * parallel.dp * parallel.ep) == 0 fails: "
                  "16 % (3 * 1 * 1) = 16 % 3 = 1", "tiny.yaml")),
    tiny_case("set_later_wins", ["model.heads=8", "parallel.tp=3"],
              "error: --set parallel.tp=3: model.heads % parallel.tp == 0 fails: 8 % 3 = 2\n"
              "error: --set parallel.tp=3: model.kv_heads % parallel.tp == 0 fails: 4 % 3 = 1\n"
              "error: --set parallel.tp=3: model.ffn_hidden % parallel.tp == 0 fails: 512 % 3 = 2\n"
              "error: --set parallel.tp=3: model.vocab % parallel.tp == 0 fails: 256 % 3 = 1\n"
              "4 problems in tiny.yaml\n"),
    # ---- files ----
    {"name": "missing_recipe", "files": {}, "recipe": "nope.yaml", "args": [],
     "commands": ("run", "validate"),
     "stderr": one("nope.yaml: error: no such file; check the recipe path", "nope.yaml")},
    {"name": "recipe_is_directory", "files": {"sub/keep": ""}, "recipe": "sub", "args": [],
     "commands": ("run", "validate"),
     "stderr": one("sub: error: is a directory; give the path of a recipe .yaml file", "sub")},
    recipe_case("missing_data_file", "name: bad\ndata: {source: text, path: nothere.txt}\n",
                one("r.yaml:2:28: error: data.path: 'nothere.txt' does not exist (relative to "
                    "{cwd})")),
    {"name": "missing_val_file", "files": {"r.yaml": "name: bad\ndata:\n  source: text\n"
                                           "  path: d.txt\n  val_path: /no/v.txt\n",
                                           "d.txt": "some text\n"},
     "recipe": "r.yaml", "args": [], "commands": ("run", "validate"),
     "stderr": one("r.yaml:5:13: error: data.val_path: '/no/v.txt' does not exist")},
    recipe_case("llmc_glob_matches_nothing",
                "name: bad\ndata: {source: llmc, path: 'shards/*.bin'}\n",
                one("r.yaml:2:28: error: data.path: 'shards/*.bin' matches no file (relative to "
                    "{cwd})")),
    tiny_case("set_missing_data_file", ["data.path=gone.txt"],
              one("error: --set data.path=gone.txt: 'gone.txt' does not exist (relative to {cwd})",
                  "tiny.yaml")),
    {"name": "empty_data_file", "files": {"r.yaml": "name: bad\ndata: {source: text, "
                                          "path: empty.txt}\n", "empty.txt": ""},
     "recipe": "r.yaml", "args": [], "commands": ("run",),
     "stderr": one("r.yaml:2:28: error: data.path: empty.txt: the file is empty; give a data file "
                   "that holds at least one token")},
    # ---- what this build cannot run (run only: the recipes are valid) ----
    # (several ranks are supported: their layout errors are in cli_multirank_faults.py)
    tiny_case("device_cuda", ["cluster.device=cuda"],
              one("error: --set cluster.device=cuda: this machine has no usable GPU (`trainctl "
                  "version` says why); use cluster.device: auto or cpu", "tiny.yaml"),
              commands=("run",)),
    # Several CUDA ranks are a supported layout (NCCL groups): refused here for the GPU alone.
    tiny_case("device_cuda_several_ranks", ["cluster.device=cuda", "parallel.dp=2"],
              one("error: --set cluster.device=cuda: this machine has no usable GPU (`trainctl "
                  "version` says why); use cluster.device: auto or cpu", "tiny.yaml"),
              commands=("run",)),
    # ---- the command line itself ----
    {"name": "run_without_recipe", "files": {}, "recipe": None, "args": [], "commands": ("run",),
     "stderr": "trainctl run: error: recipe is required\nRun 'trainctl run --help' for usage.\n"},
    {"name": "validate_without_recipe", "files": {}, "recipe": None, "args": [],
     "commands": ("validate",),
     "stderr": "trainctl validate: a recipe file is required (or --explain)\n"},
    tiny_case("unknown_option", [], "trainctl {command}: error: The following argument was not "
              "expected: --bogus\nRun 'trainctl {command} --help' for usage.\n", extra=["--bogus"]),
]


def run_case(binary, root, case):
    with cli_util.temp_dir("bad-input") as work:
        if case.get("tiny"):
            with open(os.path.join(root, "recipes", "tiny.yaml"), encoding="utf-8") as f:
                case["files"] = {"tiny.yaml": f.read(), "data/kjv.txt": TINY_DATA}
        for name, text in case["files"].items():
            os.makedirs(os.path.dirname(os.path.join(work, name)), exist_ok=True)
            with open(os.path.join(work, name), "w", encoding="utf-8") as f:
                f.write(text)
        before = cli_util.tree(work)
        recipe = [case["recipe"]] if case["recipe"] else []
        invocations = []
        for command in case["commands"]:
            invocations.append([command, *recipe, *case["args"]])
            if command == "run":
                invocations.append([command, *recipe, *case["args"], "--run-dir", "out/run"])
        for args in invocations:
            result = cli_util.run(binary, args, work, timeout=120)
            where = f"case {case['name']}: trainctl {' '.join(args)}"
            check(result.rc == 2, f"{where}: expected exit code 2\n{result.describe()}")
            expected = (case["stderr"].replace("{command}", args[0])
                        .replace("{cwd}", os.path.realpath(work)))
            check(result.stderr == expected,
                  f"{where}: stderr differs\n--- expected ---\n{expected}"
                  f"--- got ---\n{result.stderr}")
            check(result.stdout == "", f"{where}: expected no stdout\n{result.describe()}")
            after = cli_util.tree(work)
            check(after == before,
                  f"{where}: bad input created {sorted(after - before)} (nothing may be created)")


def main(binary, root):
    names = [case["name"] for case in CASES]
    check(len(set(names)) == len(names), "duplicate case names")
    for case in CASES:
        run_case(binary, root, case)
    print(f"{len(CASES)} cases")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
