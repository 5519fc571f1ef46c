#!/usr/bin/env python3
"""cli:provenance_*: provenance.json says what made a run, and `trainctl diff` says why two runs
differ.

record: every field of a run's provenance.json is present and right: the commit is git's HEAD,
  the BLAS threads and OPENBLAS_NUM_THREADS are those the run had, the recipe hash is
  recipe.yaml's, the data's files are named with their sizes and the digests of the training and
  validation tokens equal the ones recomputed here with the xxhash package (XXH3-64 per 64 Ki
  tokens, seeded with the chunk index, summed); every checkpoint's manifest carries the segments.
  A job of two ranks (our launcher: its ranks take its digests) records the same digests.
resume: a resumed run appends a segment per attempt, with the steps each made and the
  environment each had; an attempt killed with SIGKILL is recorded by the next one as killed,
  its steps ending at the checkpoint the next one resumes from.
diff: pairs made here, each differing in one thing: `trainctl diff` names it first (another thread
  count, other data, another layout, another recipe key), says a copy of the data under another
  name changes nothing, and says runs that differ in nothing (also a resumed run against one made
  in one go) should be bit-identical and are (exit 0); bad input exits 2.
"""
import array
import json
import os
import re
import shutil
import subprocess
import time

import xxhash

import cli_util
from cli_util import check

CHUNK = 1 << 16


def digest(tokens):
    """provenance.json's digest of a token list (data::token_digest), recomputed."""
    total = 0
    for c in range(0, (len(tokens) + CHUNK - 1) // CHUNK):
        part = tokens[c * CHUNK:(c + 1) * CHUNK]
        raw = array.array("i", part).tobytes()  # int32, little-endian on x86-64 and aarch64
        total = (total + xxhash.xxh3_64_intdigest(raw, seed=c)) % (1 << 64)
    return f"{total:016x}"


def provenance(run_dir):
    with open(os.path.join(run_dir, "provenance.json"), encoding="utf-8") as f:
        return json.load(f)


def run_small(binary, root, run_dir, steps, extra=(), env=None):
    saved = dict(os.environ)
    os.environ.update(env or {})
    try:
        return cli_util.run_ok(binary, cli_util.small_run_args(run_dir, steps, extra), root)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def case_record(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    run_small(binary, root, run_dir, 4, ["checkpoint.every_steps=2"])
    p = provenance(run_dir)
    check(p["format"] == "trainctl-provenance" and p["version"] == 1, f"header: {p}")
    check(len(p["segments"]) == 1, f"one attempt, one segment: {p['segments']}")
    s = p["segments"][0]
    check((s["command"], s["first_step"], s["last_step"], s["outcome"]) == ("run", 1, 4, "done"),
          f"the attempt's steps: {s}")
    check(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", s["started"]), f"started: {s}")
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True)
    binary_info = s["trainctl"]
    if head.returncode == 0:
        check(binary_info["commit"] == head.stdout.strip(),
              f"commit {binary_info['commit']} is not HEAD {head.stdout.strip()}")
    check(binary_info["tree"] in ("clean", "dirty", "unknown") and binary_info["version"] and
          binary_info["build_type"] and binary_info["compiler"].startswith("gcc "),
          f"trainctl: {binary_info}")
    check(s["libraries"]["openblas"].startswith("OpenBLAS") and s["libraries"]["glibc"],
          f"libraries: {s['libraries']}")
    check(s["host"]["cpu"] and s["host"]["cpu_threads"] == os.cpu_count() and s["host"]["os"],
          f"host: {s['host']}")
    check(s["backend"] == {"device": "cpu", "blas_threads": 1}, f"backend: {s['backend']}")
    check(s["environment"].get("OPENBLAS_NUM_THREADS") == "1", f"env: {s['environment']}")
    with open(os.path.join(run_dir, "recipe.yaml"), encoding="utf-8") as f:
        recipe_hash = re.match(r"# resolved recipe \(hash (\w+)\)", f.readline()).group(1)
    check(s["recipe_hash"] == recipe_hash and s["seed"] == 1234, f"recipe/seed: {s}")
    check(s["layout"]["world_size"] == 1 and s["layout"]["dp"] == 1, f"layout: {s['layout']}")

    # The data: the file and its size, and the digests of the tokens it gives (bytes as ids).
    text = open(os.path.join(root, "data", "kjv.txt"), "rb").read()
    (part,) = s["data"]
    check([(os.path.basename(f["path"]), f["bytes"]) for f in part["files"]] ==
          [("kjv.txt", len(text))], f"files: {part['files']}")
    n = part["train_tokens"]
    check(n + part["val_tokens"] == len(text) and part["val_tokens"] > 0, f"tokens: {part}")
    check(part["train_digest"] == digest(list(text[:n])),
          f"train digest {part['train_digest']} != {digest(list(text[:n]))} recomputed")
    check(part["val_digest"] == digest(list(text[n:])), f"val digest: {part}")

    # Every checkpoint carries the segments as they were at its save.
    for name in ("step_00000002", "step_00000004"):
        with open(os.path.join(run_dir, "checkpoints", name, "manifest.json"), encoding="utf-8") as f:
            carried = json.load(f)["provenance"]
        seg = carried["segments"][0]
        check(seg["last_step"] is None and {k: v for k, v in seg.items()
                                             if k not in ("last_step", "outcome")} ==
              {k: v for k, v in s.items() if k not in ("last_step", "outcome")},
              f"{name}'s manifest provenance differs from the run's: {seg}")

    # Two ranks (our launcher read the data and handed its ranks the digests): the same digests.
    dp2 = os.path.join(tmp, "dp2")
    run_small(binary, root, dp2, 2, ["parallel.dp=2"])
    (part2,) = provenance(dp2)["segments"][0]["data"]
    check((part2["train_digest"], part2["val_digest"]) == (part["train_digest"], part["val_digest"]),
          f"dp2 digests {part2} differ from one rank's {part}")


def case_resume(binary, root, tmp):
    run_dir = os.path.join(tmp, "run")
    run_small(binary, root, run_dir, 4, ["checkpoint.every_steps=2"])
    saved = dict(os.environ)
    os.environ["OPENBLAS_NUM_THREADS"] = "2"
    try:
        cli_util.run_ok(binary, ["resume", run_dir, "--set", "training.steps=6"], root)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    segments = provenance(run_dir)["segments"]
    check([(s["command"], s["first_step"], s["last_step"], s["outcome"]) for s in segments] ==
          [("run", 1, 4, "done"), ("resume", 5, 6, "done")], f"segments: {segments}")
    check([s["environment"]["OPENBLAS_NUM_THREADS"] for s in segments] == ["1", "2"],
          f"each attempt's environment: {[s['environment'] for s in segments]}")
    with open(os.path.join(run_dir, "checkpoints", "step_00000006", "manifest.json"),
              encoding="utf-8") as f:
        carried = json.load(f)["provenance"]["segments"]
    check(len(carried) == 2 and carried[0]["last_step"] == 4, f"step 6 carries {carried}")
    shown = cli_util.run_ok(binary, ["ckpt", "inspect", os.path.join(run_dir, "checkpoints",
                                                                      "step_00000006")], root)
    check(re.search(r"made by +run steps 1-4: trainctl \S+ \w{12} \(\w+ tree\), .*, 1 BLAS threads\n"
                    r" +resume steps 5-6: .*, 2 BLAS threads\n", shown.stdout),
          f"ckpt inspect names the attempts\n{shown.describe()}")

    # A killed attempt never writes its end: the next one records it, ending at its checkpoint.
    proc = subprocess.Popen([binary, "resume", run_dir, "--set", "training.steps=400"], cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not os.path.isdir(os.path.join(run_dir, "checkpoints", "step_00000010")):
        check(proc.poll() is None and time.monotonic() < deadline, "no step 10 checkpoint")
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    check(provenance(run_dir)["segments"][-1]["last_step"] is None, "the killed attempt's end")
    newest = max(int(n[5:]) for n in os.listdir(os.path.join(run_dir, "checkpoints"))
                 if re.fullmatch(r"step_\d{8}", n))
    cli_util.run_ok(binary, ["resume", run_dir, "--set", f"training.steps={newest + 2}"], root)
    segments = provenance(run_dir)["segments"]
    check([(s["command"], s["first_step"], s["last_step"], s["outcome"]) for s in segments] ==
          [("run", 1, 4, "done"), ("resume", 5, 6, "done"), ("resume", 7, newest, "killed"),
           ("resume", newest + 1, newest + 2, "done")], f"segments after a kill: {segments}")


def diff(binary, root, a, b):
    result = cli_util.run(binary, ["diff", a, b, "--json"], root)
    check(result.rc in (0, 1), f"diff failed\n{result.describe()}")
    report = json.loads(result.stdout)
    check((result.rc == 0) == report["identical"], f"exit code and verdict\n{result.describe()}")
    return report


def case_diff(binary, root, tmp):
    def make(name, extra=(), env=None, steps=4):
        run_dir = os.path.join(tmp, name)
        run_small(binary, root, run_dir, steps, extra, env)
        return run_dir

    base = make("base")
    same = make("same")
    r = diff(binary, root, base, same)
    check(r["causes"] == [] and r["expected_identical"] and r["identical"] and
          r["weights"]["a"] == r["weights"]["b"], f"identical runs: {r}")
    human = cli_util.run(binary, ["diff", base, same], root)
    check(human.rc == 0 and "should be bit-identical, and they are: identical at all 4 common steps"
          in human.stdout, f"identical runs, in words\n{human.describe()}")

    # A run made in two attempts equals one made in one go.
    resumed = make("resumed", ["checkpoint.every_steps=2"], steps=2)
    cli_util.run_ok(binary, ["resume", resumed, "--set", "training.steps=4"], root)
    r = diff(binary, root, base, resumed)
    check(r["causes"] == [] and r["identical"], f"resumed vs straight: {r}")

    data = os.path.join(tmp, "data")
    os.makedirs(data)
    shutil.copy(os.path.join(root, "data", "kjv.txt"), os.path.join(data, "copy.txt"))
    text = bytearray(open(os.path.join(root, "data", "kjv.txt"), "rb").read())
    for i in range(0, len(text), 50):  # every window of a batch sees some of them
        text[i] = ord("#") if text[i] != ord("#") else ord("%")
    open(os.path.join(data, "edited.txt"), "wb").write(bytes(text))
    r = diff(binary, root, base, make("copy", [f"data.path={data}/copy.txt"]))
    check(r["causes"] == [] and r["identical"] and any("other paths" in u for u in r["no_effect"]),
          f"the same data under another name changes nothing: {r}")

    cases = {
        "threads": make("threads", env={"OPENBLAS_NUM_THREADS": "2"}),
        "data": make("edited", [f"data.path={data}/edited.txt"]),
        "layout": make("dp2", ["parallel.dp=2"]),
        "recipe": make("lr", ["optimizer.lr=1.0e-3"]),
        "seed": make("seed", ["determinism.seed=7"]),
    }
    for kind, run_dir in cases.items():
        r = diff(binary, root, base, run_dir)
        check(r["causes"] and r["causes"][0]["kind"] == kind and not r["expected_identical"],
              f"{kind}: named first? {r}")
        print(f"{kind}: {r['causes'][0]['detail'][:100]} | identical {r['identical']}")
    r = diff(binary, root, base, cases["recipe"])
    check("optimizer.lr" in r["causes"][0]["detail"] and not r["identical"] and
          r["first_difference"]["step"] >= 1, f"lr: {r}")
    r = diff(binary, root, base, cases["data"])
    check(not r["identical"] and r["first_difference"]["step"] == 1, f"data: {r}")
    human = cli_util.run(binary, ["diff", base, cases["recipe"]], root)
    check(human.rc == 1 and re.search(r"1\. recipe: optimizer\.lr: 0\.003 vs 0\.001", human.stdout)
          and "Losses: first differ at step" in human.stdout, f"in words\n{human.describe()}")

    # Bad input: exit 2 naming the directory and what is missing.
    for args, pattern in (([base, os.path.join(tmp, "nowhere")], r"nowhere is not a directory"),
                          ([base, data], r"data has no provenance\.json")):
        result = cli_util.run(binary, ["diff", *args], root)
        check(result.rc == 2 and re.search(pattern, result.stderr), f"{result.describe()}")


if __name__ == "__main__":
    cli_util.cases_main({"record": case_record, "resume": case_resume, "diff": case_diff},
                        "provenance")
