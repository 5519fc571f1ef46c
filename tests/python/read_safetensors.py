#!/usr/bin/env python3
"""Readers for the export tests (tests/integration/cli_ckpt_export.py), written from the format
descriptions and independent of trainctl's C++:

  read_safetensors_raw(path)  the header, metadata and raw bytes of every tensor of a safetensors
                              file (numpy's safetensors loader has no bfloat16: compare bits)
  read_checkpoint(step_dir)   every tensor of a trainctl checkpoint as a numpy array (bf16 as
                              uint16 bits), assembled from its slices (docs/checkpoints.md)
  hf_expectations(model)      {hf name: (checkpoint tensor, transform)} for the gpt2 / llama /
                              mixtral namings of lib/ckpt/export.hpp, from the model description

Usage as a script: read_safetensors.py FILE prints {name: [dtype, shape]} and the metadata.
"""
import json
import os
import struct
import sys

import numpy as np

NUMPY_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16,
                "I32": np.int32, "U16": np.uint16}
CHECKPOINT_DTYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": np.uint16,
                     "i32": np.int32, "u16": np.uint16}


def read_safetensors_raw(path):
    """(metadata, {name: (dtype, shape, numpy array of the stored values or bits)})."""
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    if length % 8 or 8 + length > len(data):
        raise ValueError(f"{path}: header length {length} is not a multiple of 8 or too long")
    header = json.loads(data[8:8 + length])
    metadata = header.pop("__metadata__", {})
    base = 8 + length
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        array = np.frombuffer(data[base + begin:base + end], dtype=NUMPY_DTYPES[entry["dtype"]])
        tensors[name] = (entry["dtype"], entry["shape"], array.reshape(entry["shape"]))
    return metadata, tensors


def read_checkpoint(step_dir):
    """{name: numpy array} of a checkpoint step directory (no checksum checks: trainctl's job)."""
    with open(os.path.join(step_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    files = {}
    tensors = {}
    for t in manifest["tensors"]:
        dtype = np.dtype(CHECKPOINT_DTYPES[t["dtype"]])
        out = np.zeros(t["shape"], dtype=dtype)
        for s in t["slices"]:
            if s["file"] not in files:
                with open(os.path.join(step_dir, s["file"]), "rb") as f:
                    files[s["file"]] = f.read()
            raw = files[s["file"]][s["offset"]:s["offset"] + s["length"]]
            box = tuple(slice(b, e) for b, e in s["index"])
            out[box] = np.frombuffer(raw, dtype=dtype).reshape([e - b for b, e in s["index"]])
        tensors[t["name"]] = out
    return manifest, tensors


def hf_expectations(model):
    """{hf name: function(checkpoint tensors) -> expected array} and the naming name."""
    L, C, H, KV = model["layers"], model["hidden"], model["heads"], model["kv_heads"]
    D = C // H
    x = {}

    def param(name, transform=lambda a: a):
        return lambda t: transform(t["model/" + name])

    if model["norm"] == "layernorm":
        naming = "gpt2"
        x["wte.weight"] = param("embed.wte")
        x["wpe.weight"] = param("embed.wpe")
        x["ln_f.weight"] = param("final_norm.weight")
        x["ln_f.bias"] = param("final_norm.bias")
        for i in range(L):
            h, l = f"h.{i}.", f"layers.{i}."
            for p in ("weight", "bias"):
                x[h + "ln_1." + p] = param(l + "attn_norm." + p)
                x[h + "ln_2." + p] = param(l + "mlp_norm." + p)
            for hf, ours in (("attn.c_attn", "attn.qkv"), ("attn.c_proj", "attn.proj"),
                             ("mlp.c_fc", "mlp.fc1"), ("mlp.c_proj", "mlp.fc2")):
                x[h + hf + ".weight"] = param(l + ours + ".weight", lambda a: a.T)  # Conv1D
                x[h + hf + ".bias"] = param(l + ours + ".bias")
    else:
        naming = "mixtral" if model["experts"] > 0 else "llama"
        x["model.embed_tokens.weight"] = param("embed.wte")
        x["model.norm.weight"] = param("final_norm.weight")
        parts = ["weight", "bias"] if model["bias"] else ["weight"]
        Q, K = H * D, KV * D
        for i in range(L):
            h, l = f"model.layers.{i}.", f"layers.{i}."
            x[h + "input_layernorm.weight"] = param(l + "attn_norm.weight")
            x[h + "post_attention_layernorm.weight"] = param(l + "mlp_norm.weight")
            for p in parts:
                qkv = l + "attn.qkv." + p
                x[h + "self_attn.q_proj." + p] = param(qkv, lambda a: a[:Q])
                x[h + "self_attn.k_proj." + p] = param(qkv, lambda a: a[Q:Q + K])
                x[h + "self_attn.v_proj." + p] = param(qkv, lambda a: a[Q + K:])
                x[h + "self_attn.o_proj." + p] = param(l + "attn.proj." + p)
            moe = model["experts"] > 0 and (i + 1) % model["moe_every"] == 0
            if moe:
                F = model["expert_ffn_hidden"]
                x[h + "block_sparse_moe.gate.weight"] = param(l + "moe.router.weight")
                for e in range(model["experts"]):
                    ex = f"{h}block_sparse_moe.experts.{e}."
                    for p in parts:
                        fc1, fc2 = l + "moe.fc1." + p, l + "moe.fc2." + p
                        x[ex + "w1." + p] = param(fc1, lambda a, e=e: a[e, :F])
                        x[ex + "w3." + p] = param(fc1, lambda a, e=e: a[e, F:])
                        x[ex + "w2." + p] = param(fc2, lambda a, e=e: a[e])
            else:
                F = model["ffn_hidden"]
                for p in parts:
                    fc1 = l + "mlp.fc1." + p
                    x[h + "mlp.gate_proj." + p] = param(fc1, lambda a: a[:F])
                    x[h + "mlp.up_proj." + p] = param(fc1, lambda a: a[F:])
                    x[h + "mlp.down_proj." + p] = param(l + "mlp.fc2." + p)
    if not model["tied_embeddings"]:
        x["lm_head.weight"] = param("lm_head.weight")
    return naming, x


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: read_safetensors.py FILE", file=sys.stderr)
        sys.exit(2)
    meta, tensors = read_safetensors_raw(sys.argv[1])
    print(json.dumps({"metadata": meta,
                      "tensors": {n: [d, s] for n, (d, s, _) in sorted(tensors.items())}},
                     indent=1))
