#!/usr/bin/env python3
"""cli:tokenize: `trainctl data encode` gives token for token the ids of the libraries the
tokenizers come from: Python's `tokenizers` (encode(text, add_special_tokens=False).ids) for
tokenizer.json files in the shapes of GPT-2, Llama 3 and Qwen2, and `sentencepiece`
(SentencePieceProcessor.encode(text)) for BPE and unigram models, all trained here on the bundled
text (tests/integration/tokenizer_fixtures.py; no download). The text mixes what tokenizers get
wrong: accents, CJK, Arabic, combining marks and non-NFC text, whitespace runs (tabs, \\r\\n,
trailing spaces), long numbers, emoji with ZWJ sequences, contractions in mixed case, special
tokens inside text, then a large part of data/kjv.txt. Also: stdin, --json, and exit 2 naming the
file for a tokenizer trainctl does not implement, a missing file and text that is not UTF-8.
"""
import json
import os

import cli_util
import tokenizer_fixtures
from cli_util import check

HARD_TEXT = (
    "Crème brûlée at the café: naïve résumé, ÅNGSTRÖM. Non-NFC: Cafe\u0301, A\u030a, \u212b, "
    "\u1e0b\u0323 q\u0307\u0323.\n"
    "東京都の天気は晴れです。北京欢迎你！한국어 텍스트. مرحبا بالعالم، كيف حالك؟ שלום עולם ١٢٣٤٥\n"
    "Tabs\t\tand  double  spaces   and trailing spaces   \n\n\n\r\nWindows line\r\nend \r\n \t \n"
    "Digits: 1234567890123456789 3.14159 2024-01-01 00000007 1,000,000\n"
    "Emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇫🇷\u200b🙂\n"
    "Contractions: I'm you're THEY'VE she'Ll We'D it's DON'T 'S 'ſt o'clock rock'n'roll\n"
    "Specials: <|endoftext|> inside text<|endoftext|>and <|im_start|>user\n<|im_end|> "
    "<|end_of_text|><|begin_of_text|> <|reserved_special_token_3|> <|endoftext <s></s>\n"
    "Odd spaces: a\u00a0b\u2028c\u3000d\x85e \u180e f\u200bg \x1c\x1d \u0300x  \u2003y\n"
    "Code: def f(x):\n    return x**2  # comment\n\tif (a&&b) { c->d[0] = 'e'; }\n")


def corpus(root, sentencepiece):
    """The hard text, then 500 KB of the bible (250 KB for SentencePiece: on one text of ~90,000
    tokens libsentencepiece 0.1.97's unigram picked "or an" where sentencepiece 0.2 picks
    "o ran" (scores -16.65 and -16.61), as if its Viterbi sums scores in float; documents, which
    `data prepare` encodes one at a time, are far shorter)."""
    return HARD_TEXT + tokenizer_fixtures.kjv(root)[400_000:650_000 if sentencepiece else 900_000]


def library_ids(path, text):
    if path.endswith(".model"):
        import sentencepiece
        return sentencepiece.SentencePieceProcessor(model_file=path).encode(text)
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path).encode(text, add_special_tokens=False).ids


def describe_mismatch(name, path, text, got, want):
    """The first differing position, with the tokens around it on both sides."""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    lo, hi = max(0, at - 6), at + 6
    if path.endswith(".model"):
        import sentencepiece
        processor = sentencepiece.SentencePieceProcessor(model_file=path)
        piece = processor.id_to_piece
    else:
        from tokenizers import Tokenizer
        piece = Tokenizer.from_file(path).id_to_token
    return (f"{name} ({path}): {len(got)} ids from trainctl, {len(want)} from the library; "
            f"first difference at id {at}\n"
            f"  trainctl: {got[lo:hi]} {[piece(i) for i in got[lo:hi]]}\n"
            f"  library:  {want[lo:hi]} {[piece(i) for i in want[lo:hi]]}\n"
            f"  text there (library's tokens decoded): "
            f"{''.join(piece(i) or '' for i in want[lo:hi])!r}")


def check_equal(binary, root, name, path, text_file, text):
    result = cli_util.run_ok(binary, ["data", "encode", "--tokenizer", path, text_file], root)
    got = [int(word) for word in result.stdout.split()]
    want = library_ids(path, text)
    check(got == want, describe_mismatch(name, path, text, got, want))
    return got


def main(binary, root):
    with cli_util.temp_dir("tokenize") as tmp:
        tokenizers = tokenizer_fixtures.make_all(root, tmp)
        for name, path in tokenizers.items():
            text = corpus(root, path.endswith(".model"))
            text_file = os.path.join(tmp, "text.txt")
            with open(text_file, "w", encoding="utf-8", newline="") as f:
                f.write(text)
            ids = check_equal(binary, root, name, path, text_file, text)
            # Each piece on its own too: a short text starts with the hard cases.
            for line in HARD_TEXT.splitlines(keepends=True):
                line_file = os.path.join(tmp, "line.txt")
                with open(line_file, "w", encoding="utf-8", newline="") as f:
                    f.write(line)
                check_equal(binary, root, name, path, line_file, line)
            print(f"{name}: {len(ids)} ids equal")

        # stdin, --json, the end-of-document token, and a folder as --tokenizer.
        gpt2 = os.path.dirname(tokenizers["gpt2"])
        stdin = cli_util.subprocess.run(
            [binary, "data", "encode", "--tokenizer", gpt2, "--json"], input="Hello<|endoftext|>",
            capture_output=True, text=True, timeout=60)
        check(stdin.returncode == 0, f"data encode from stdin failed: {stdin.stderr}")
        document = json.loads(stdin.stdout)
        want = library_ids(tokenizers["gpt2"], "Hello<|endoftext|>")
        check(document["ids"] == want and document["kind"] == "hf-bpe" and
              document["eod_token"] == "<|endoftext|>" and document["eod_id"] == want[-1] and
              document["vocab_size"] == 3000 and document["tokenizer"].endswith("tokenizer.json"),
              f"data encode --json from stdin: {document}, expected ids {want}")
        sp = json.loads(cli_util.run_ok(binary, ["data", "encode", "--tokenizer",
                                                 tokenizers["sp_bpe"], "--json", text_file],
                                        root).stdout)
        check(sp["kind"] == "sentencepiece" and sp["eod_token"] == "</s>" and sp["eod_id"] == 2,
              f"sentencepiece facts: {dict(sp, ids='...')}")

        # Bad input: exit 2 naming the file, the field and the value.
        with open(tokenizers["llama3"], encoding="utf-8") as f:
            document = json.load(f)
        document["model"]["byte_fallback"] = True
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w", encoding="utf-8") as f:
            json.dump(document, f)
        for args, words in [
                (["--tokenizer", bad, text_file], [bad, "model.byte_fallback is true"]),
                (["--tokenizer", os.path.join(tmp, "none.json"), text_file],
                 ["none.json: no such file"]),
                (["--tokenizer", tokenizers["gpt2"], os.path.join(tmp, "none.txt")],
                 ["none.txt"]),
                (["--tokenizer", tokenizers["gpt2"], "--eod", "<nope>", text_file],
                 ["'<nope>' is not one of its tokens", "--eod"])]:
            result = cli_util.run(binary, ["data", "encode", *args], root)
            check(result.rc == 2 and all(w in result.stderr for w in words),
                  f"expected exit 2 and {words} in the message\n{result.describe()}")
        latin1 = os.path.join(tmp, "latin1.txt")
        with open(latin1, "wb") as f:
            f.write("café".encode("latin-1"))
        result = cli_util.run(binary, ["data", "encode", "--tokenizer", tokenizers["qwen2"],
                                       latin1], root)
        check(result.rc == 2 and "latin1.txt" in result.stderr and
              "not valid UTF-8 at byte 3" in result.stderr,
              f"expected exit 2 for Latin-1 text\n{result.describe()}")


if __name__ == "__main__":
    cli_util.main_wrapper(main)
