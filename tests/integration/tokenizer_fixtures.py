"""Small tokenizers trained here with the real PyPI libraries (no hub download), in the shapes of
the tokenizers users bring: shared by cli:tokenize and scripts/bench-tokenize.

    make_all(root, out_dir) -> {name: path}

  gpt2      tokenizers BPE + ByteLevel pre-tokenizer (GPT-2's regex), <|endoftext|> special, merges
            written as "a b" strings (the older form)
  llama3    Split with Llama 3's regex (Isolated) + ByteLevel(use_regex=False), ignore_merges,
            <|begin_of_text|> <|end_of_text|> and reserved specials, merges as [a, b] pairs
  qwen2     NFC normalizer, Split with Qwen2's regex + ByteLevel, <|endoftext|> <|im_start|>
            <|im_end|> specials
  sp_bpe    sentencepiece BPE model (.model)
  sp_unigram  sentencepiece unigram model (.model)
"""
import json
import os

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+"
                 r"[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Text beyond the King James Bible, so the vocabularies hold merges for it too.
EXTRA = ("Crème brûlée, naïve café, Ångström; 東京都の天気は晴れです。北京欢迎你。"
         "مرحبا بالعالم، كيف حالك؟ Привет, мир! 12345678901234567890 3.14159 "
         "I'm, you're, they've, she'll, we'd, It's, DON'T, I'M. 😀👍🏽👨‍👩‍👧 \t\ttabs\r\n")


def kjv(root, limit=None):
    with open(os.path.join(root, "data", "kjv.txt"), encoding="utf-8") as f:
        text = f.read()
    return text[:limit] if limit else text


def _bpe(root, out, name, vocab, pre_tokenizer, normalizer, specials, ignore_merges,
         string_merges):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tokenizer.normalizer = normalizer
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    text = kjv(root, 400_000)
    tokenizer.train_from_iterator([text[i:i + 10_000] for i in range(0, len(text), 10_000)]
                                  + [EXTRA] * 20, trainer)
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    tokenizer.save(path)
    if string_merges:  # rewrite merges in the older "a b" form
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        document["model"]["merges"] = [f"{a} {b}" for a, b in document["model"]["merges"]]
        with open(path, "w", encoding="utf-8") as f:
            json.dump(document, f, ensure_ascii=False)
    return path


def make_gpt2(root, out):
    from tokenizers import pre_tokenizers
    return _bpe(root, out, "gpt2", 3000, pre_tokenizers.ByteLevel(add_prefix_space=False), None,
                ["<|endoftext|>"], False, True)


def make_llama3(root, out):
    from tokenizers import Regex, pre_tokenizers
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    specials = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(8)]
    return _bpe(root, out, "llama3", 4000, pre, None, specials, True, False)


def make_qwen2(root, out):
    from tokenizers import Regex, normalizers, pre_tokenizers
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    return _bpe(root, out, "qwen2", 3500, pre, normalizers.NFC(),
                ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, False)


def _sentencepiece(root, out, name, model_type, vocab):
    import sentencepiece
    folder = os.path.join(out, name)
    os.makedirs(folder, exist_ok=True)
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write(kjv(root, 300_000))
        f.write(("\n" + EXTRA) * 20)
    prefix = os.path.join(folder, "tokenizer")
    sentencepiece.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type=model_type, vocab_size=vocab,
        input_sentence_size=20000, shuffle_input_sentence=True, character_coverage=1.0,
        byte_fallback=False, minloglevel=2, num_threads=1)
    return prefix + ".model"


def make_sp_bpe(root, out):
    return _sentencepiece(root, out, "sp_bpe", "bpe", 2000)


def make_sp_unigram(root, out):
    return _sentencepiece(root, out, "sp_unigram", "unigram", 2000)


MAKERS = {"gpt2": make_gpt2, "llama3": make_llama3, "qwen2": make_qwen2, "sp_bpe": make_sp_bpe,
          "sp_unigram": make_sp_unigram}


def make_all(root, out, names=None):
    return {name: MAKERS[name](root, out) for name in (names or MAKERS)}
