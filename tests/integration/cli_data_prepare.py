#!/usr/bin/env python3
"""cli:data_prepare_*: `trainctl data prepare` writes Megatron's indexed dataset format, read back
here by Megatron's reader logic, and trainctl trains on datasets Megatron's writer made.

`megatron_reader`: JSON Lines (plain and .gz) and a folder of .txt files, prepared with a GPT-2-
style tokenizer.json and a SentencePiece model (trained here by the PyPI packages; no download),
are read by a reimplementation of megatron/core/datasets/indexed_dataset.py's _IndexReader from
its documented layout (header, dtype code, sizes, pointers, document indices; tokens by pointer):
every document is the PyPI library's own ids for the text plus the end-of-document id, in input
order, and 1 or 2 workers write the same bytes. The sidecar names the tokenizer's SHA-256.
`megatron_writer`: a dataset written by a reimplementation of Megatron's _IndexWriter (int32
tokens, documents of several sequences, as preprocess_data.py --split-sentences writes) trains in
trainctl, alone and blended 3:1 with a prepared dataset, whose run records both in data.json; the
blended run stopped at step 4 and resumed gives the losses of the run that never stopped.
`bad_input`: exit 2 with the file, the value and the fix, and nothing at the output prefix: a
missing input, an unknown extension, an existing dataset without --overwrite, a line that is not
JSON (found mid-way: no file is left behind), a tokenizer trainctl does not read; and for a run,
an index that does not match its .bin, and a model.vocab below the tokenizer's vocabulary.
"""
import gzip
import hashlib
import json
import os
import struct

import cli_util
import tokenizer_fixtures
from cli_util import check

DTYPES = {1: ("B", 1), 2: ("b", 1), 3: ("h", 2), 4: ("i", 4), 5: ("q", 8), 6: ("d", 8),
          7: ("f", 4), 8: ("H", 2)}

DOCS = [
    "In the beginning God created the heaven and the earth.",
    "Crème brûlée, naïve café: 東京都の天気は晴れです。 مرحبا بالعالم 😀👍🏽",
    "",  # empty: skipped, as Megatron's tools do
    "Digits 1234567890 and  spaces\t\ttabs\r\nlines <|endoftext|> inside text.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
]


def read_megatron(prefix):
    """Megatron's _IndexReader and IndexedDataset.__getitem__, from the documented layout:
    returns (dtype code, [document: [sequence: [ids]]])."""
    with open(prefix + ".idx", "rb") as f:
        index = f.read()
    check(index[:9] == b"MMIDIDX\x00\x00", f"{prefix}.idx: bad magic {index[:9]!r}")
    version, = struct.unpack_from("<Q", index, 9)
    code, = struct.unpack_from("<B", index, 17)
    sequences, documents = struct.unpack_from("<QQ", index, 18)
    check(version == 1, f"version {version}")
    at = 34
    sizes = struct.unpack_from(f"<{sequences}i", index, at)
    at += 4 * sequences
    pointers = struct.unpack_from(f"<{sequences}q", index, at)
    at += 8 * sequences
    doc_index = struct.unpack_from(f"<{documents}q", index, at)
    at += 8 * documents
    check(at == len(index), f"{prefix}.idx: {len(index) - at} bytes after the document index")
    letter, width = DTYPES[code]
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    out = []
    for d in range(documents - 1):
        out.append([list(struct.unpack_from(f"<{sizes[s]}{letter}", data, pointers[s]))
                    for s in range(doc_index[d], doc_index[d + 1])])
    return code, out


def write_megatron(prefix, code, documents):
    """Megatron's _IndexWriter (with the builder's add_document): documents of sequences."""
    letter, width = DTYPES[code]
    sizes, pointers, doc_index, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for document in documents:
            for sequence in document:
                f.write(struct.pack(f"<{len(sequence)}{letter}", *sequence))
                sizes.append(len(sequence))
                pointers.append(offset)
                offset += len(sequence) * width
            doc_index.append(len(sizes))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", code))
        f.write(struct.pack("<QQ", len(sizes), len(doc_index)))
        f.write(struct.pack(f"<{len(sizes)}i", *sizes))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack(f"<{len(doc_index)}q", *doc_index))


def prepare(binary, cwd, inputs, tokenizer, out, *extra):
    return cli_util.run_ok(binary, ["data", "prepare", *inputs, "--tokenizer", tokenizer,
                                    "--out", out, "--progress", "none", *extra], cwd)


def megatron_reader(binary, root, tmp):
    tokenizers = tokenizer_fixtures.make_all(root, os.path.join(tmp, "tok"), ["gpt2", "sp_bpe"])
    with open(os.path.join(tmp, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, text in enumerate(DOCS):
            f.write(json.dumps({"id": i, "text": text}) + "\n")
            if i == 1:
                f.write("\n")  # a blank line is no document
    with open(os.path.join(tmp, "docs.jsonl"), "rb") as f, \
            gzip.open(os.path.join(tmp, "docs.jsonl.gz"), "wb") as g:
        g.write(f.read())
    os.makedirs(os.path.join(tmp, "folder", "b"))
    for name, text in [("b/2.txt", DOCS[4]), ("a.txt", DOCS[0]), ("b/1.txt", DOCS[1])]:
        with open(os.path.join(tmp, "folder", name), "w", encoding="utf-8") as f:
            f.write(text)

    from tokenizers import Tokenizer
    import sentencepiece
    gpt2 = Tokenizer.from_file(tokenizers["gpt2"])
    sp = sentencepiece.SentencePieceProcessor(model_file=tokenizers["sp_bpe"])
    encoders = {"gpt2": (lambda t: gpt2.encode(t, add_special_tokens=False).ids,
                         gpt2.token_to_id("<|endoftext|>")),
                "sp_bpe": (lambda t: sp.encode(t), sp.eos_id())}
    for name, (encode, eod) in encoders.items():
        expected = [encode(t) + [eod] for t in DOCS if t]
        for inputs, workers in [(["docs.jsonl"], "1"), (["docs.jsonl.gz"], "2")]:
            prefix = f"out/{name}-{inputs[0]}-{workers}"
            result = prepare(binary, tmp, inputs, tokenizers[name], prefix, "--workers", workers)
            check("skipped 1 empty document" in result.stdout, result.describe())
            code, documents = read_megatron(os.path.join(tmp, prefix))
            check(code == 8, f"{prefix}: dtype code {code}, expected 8 (uint16) for a small vocab")
            got = [sum(sequences, []) for sequences in documents]
            for i, (a, b) in enumerate(zip(got, expected)):
                check(a == b, f"{prefix}: document {i} differs from {name}'s library:\n"
                              f"trainctl {a}\nlibrary  {b}")
            check(len(got) == len(expected), f"{prefix}: {len(got)} documents, not "
                                              f"{len(expected)}")
        one, two = (open(os.path.join(tmp, f"out/{name}-{n}.bin"), "rb").read()
                    for n in ("docs.jsonl-1", "docs.jsonl.gz-2"))
        check(one == two, f"{name}: 1 and 2 workers (plain and gzip input) wrote different tokens")
        with open(os.path.join(tmp, f"out/{name}-docs.jsonl-1.json")) as f:
            sidecar = json.load(f)
        with open(tokenizers[name], "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        check(sidecar["tokenizer"]["sha256"] == digest and sidecar["tokenizer"]["eod_id"] == eod
              and sidecar["documents"] == len(expected), f"{name}: sidecar {sidecar}")

    # A folder: its .txt files in sorted path order, one document each.
    prepare(binary, tmp, ["folder"], tokenizers["gpt2"], "out/folder")
    _, documents = read_megatron(os.path.join(tmp, "out/folder"))
    encode, eod = encoders["gpt2"]
    check([sum(d, []) for d in documents] == [encode(t) + [eod] for t in
                                               (DOCS[0], DOCS[1], DOCS[4])],
          "folder: the documents are not a.txt, b/1.txt, b/2.txt in that order")


def train_args(run_dir, steps, data_sets):
    sets = ["model.arch=llama", "model.layers=2", "model.hidden=64", "model.heads=4",
            "model.kv_heads=2", "model.ffn_hidden=128", "model.seq_len=32", "model.vocab=4096",
            f"training.steps={steps}", "training.global_batch=4", "training.micro_batch=2",
            "schedule.warmup_steps=2", "schedule.decay_steps=8", "logging.every_steps=1",
            "logging.eval_every_steps=0",
            "logging.tensorboard=false", "checkpoint.every_steps=4", "checkpoint.async=false",
            *data_sets]
    return ["--run-dir", run_dir, *[a for s in sets for a in ("--set", s)]]


def megatron_writer(binary, root, tmp):
    tokenizer = tokenizer_fixtures.make_llama3(root, os.path.join(tmp, "tok"))
    prepare(binary, tmp, [os.path.join(root, "data", "kjv.txt")], tokenizer, "kjv")
    # Megatron's writer: int32 ids, documents of several sequences ("sentences").
    _, kjv = read_megatron(os.path.join(tmp, "kjv"))
    ids = kjv[0][0][:60000]
    documents = [[ids[i:i + 300], ids[i + 300:i + 1000]] for i in range(0, len(ids), 1000)]
    write_megatron(os.path.join(tmp, "meg"), 4, documents)
    recipe = os.path.join(tmp, "r.yaml")
    with open(recipe, "w") as f:
        f.write("name: r\ndata: {source: megatron, path: meg}\n")
    cli_util.run_ok(binary, ["run", recipe, *train_args("runs/meg", 8, [])], tmp)
    losses = [m["loss"] for m in cli_util.read_metrics(os.path.join(tmp, "runs/meg"))]
    check(len(losses) == 8 and losses[-1] < losses[0], f"Megatron-written data: losses {losses}")
    with open(os.path.join(tmp, "runs/meg/data.json")) as f:
        record = json.load(f)["datasets"]
    check(len(record) == 1 and "tokenizer" not in record[0]
          and "60 documents, 60000 int32 tokens" in record[0]["source"], f"data.json {record}")

    # A blend, 3:1, and a resume in the middle of it.
    blend = ["data.path=", "data.sources=[{path: meg, weight: 3}, {path: kjv, weight: 1}]"]
    cli_util.run_ok(binary, ["run", recipe, *train_args("runs/blend", 8, blend)], tmp)
    straight = cli_util.read_metrics(os.path.join(tmp, "runs/blend"))
    with open(os.path.join(tmp, "runs/blend/data.json")) as f:
        record = json.load(f)["datasets"]
    check([d["weight"] for d in record] == [3, 1] and
          record[1]["tokenizer"]["path"] == tokenizer and record[1]["tokenizer"]["vocab_size"] ==
          4000, f"blend data.json {record}")
    cli_util.run_ok(binary, ["run", recipe, *train_args("runs/stopped", 4, blend)], tmp)
    cli_util.run_ok(binary, ["resume", "runs/stopped", "--set", "training.steps=8"], tmp)
    resumed = cli_util.read_metrics(os.path.join(tmp, "runs/stopped"))
    check([m["loss"] for m in resumed] == [m["loss"] for m in straight],
          f"the blend resumed at step 4 parts from the straight run:\n{resumed}\n{straight}")


def bad_input(binary, root, tmp):
    tokenizer = tokenizer_fixtures.make_gpt2(root, os.path.join(tmp, "tok"))
    with open(os.path.join(tmp, "ok.jsonl"), "w") as f:
        f.write('{"text": "one"}\n' * 3000)
    with open(os.path.join(tmp, "bad.jsonl"), "w") as f:
        f.write('{"text": "one"}\n' * 5000 + "{not json\n")
    open(os.path.join(tmp, "notes.csv"), "w").close()

    def refused(args, expected, prefix="out/x"):
        result = cli_util.run(binary, ["data", "prepare", *args, "--progress", "none"], tmp)
        check(result.rc == 2 and expected in result.stderr,
              f"expected exit 2 naming {expected!r}\n{result.describe()}")
        leftovers = [n for n in os.listdir(os.path.join(tmp, os.path.dirname(prefix)))
                     if n.startswith(os.path.basename(prefix))] if os.path.isdir(
            os.path.join(tmp, os.path.dirname(prefix))) else []
        check(not leftovers, f"{args}: left {leftovers} behind")

    refused(["missing.jsonl", "--tokenizer", tokenizer, "--out", "out/x"],
            "missing.jsonl: no such file or folder")
    refused(["notes.csv", "--tokenizer", tokenizer, "--out", "out/x"],
            "notes.csv: data prepare reads .txt, .jsonl or .json, each optionally .gz or .zst")
    refused(["ok.jsonl", "--tokenizer", "nothing.json", "--out", "out/x"], "--tokenizer ")
    refused(["ok.jsonl", "bad.jsonl", "--tokenizer", tokenizer, "--out", "out/x", "--workers",
             "2"], "bad.jsonl:5001: not a JSON object")
    # Found while reading, into folders the run made: the folders go too.
    refused(["ok.jsonl", "bad.jsonl", "--tokenizer", tokenizer, "--out", "new/deeper/x"],
            "bad.jsonl:5001: not a JSON object", prefix="new/deeper/x")
    check(not os.path.exists(os.path.join(tmp, "new")), "the folders made for --out were left")
    refused(["ok.jsonl", "--tokenizer", tokenizer, "--out", "out/x", "--jsonl-key", "body"],
            'ok.jsonl:1: no string field "body" in this line; name the field that holds the '
            "text with --jsonl-key")
    prepare(binary, tmp, ["ok.jsonl"], tokenizer, "out/x")
    before = open(os.path.join(tmp, "out/x.bin"), "rb").read()
    result = cli_util.run(binary, ["data", "prepare", "ok.jsonl", "--tokenizer", tokenizer,
                                   "--out", "out/x"], tmp)
    check(result.rc == 2 and "out/x.bin already exists; choose another prefix, or pass "
                             "--overwrite" in result.stderr, result.describe())
    check(open(os.path.join(tmp, "out/x.bin"), "rb").read() == before, "out/x.bin changed")
    prepare(binary, tmp, ["ok.jsonl"], tokenizer, "out/x", "--overwrite")

    # Runs: a model too small for the tokenizer, and an index from another dataset.
    recipe = os.path.join(tmp, "r.yaml")
    with open(recipe, "w") as f:
        f.write("name: r\ndata: {source: megatron, path: out/x}\n")
    result = cli_util.run(binary, ["run", recipe, *train_args("runs/small", 2,
                                                              ["model.vocab=2048"])], tmp)
    check(result.rc == 2 and "was made by a tokenizer of 3000 ids" in result.stderr and
          "set model.vocab to at least 3000" in result.stderr, result.describe())
    check(not os.path.exists(os.path.join(tmp, "runs/small")), "runs/small was created")
    os.replace(os.path.join(tmp, "out/x.idx"), os.path.join(tmp, "out/x.idx.keep"))
    write_megatron(os.path.join(tmp, "out/other"), 8, [[[1, 2, 3]]])
    os.replace(os.path.join(tmp, "out/other.idx"), os.path.join(tmp, "out/x.idx"))
    result = cli_util.run(binary, ["run", recipe, *train_args("runs/mismatch", 2, [])], tmp)
    check(result.rc == 2 and "out/x.idx: its 1 sequences hold 6 bytes of uint16 tokens, but "
                             "out/x.bin has" in result.stderr, result.describe())


if __name__ == "__main__":
    cli_util.cases_main({"megatron_reader": megatron_reader, "megatron_writer": megatron_writer,
                         "bad_input": bad_input}, "data_prepare")
