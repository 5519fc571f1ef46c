#!/usr/bin/env python3
"""An independent judge of `trainctl ckpt export`: the language-model loss of a token sequence,
computed in numpy (float64) from the EXPORTED safetensors tensors under the Hugging Face names and
layouts, following the Hugging Face model definitions, not trainctl's mapping code:

  gpt2_loss(tensors, tokens, ...)   transformers' GPT2LMHeadModel (modeling_gpt2.py): learned
                                    positions wpe, LayerNorm with bias, Conv1D weights stored
                                    [in, out] (y = x @ W + b), fused c_attn = [q | k | v] columns,
                                    attention scaled by 1/sqrt(head_dim), gelu_new (tanh), lm_head
                                    tied to wte unless lm_head.weight is present
  llama_loss(tensors, tokens, ...)  transformers' LlamaForCausalLM (modeling_llama.py): RMSNorm
                                    (weight only), nn.Linear weights [out, in] (y = x @ W.T), RoPE
                                    with rotate_half on the two halves of each head (inv_freq =
                                    theta^(-2i/d), cos/sin = cat(freqs, freqs)), grouped-query
                                    attention by repeat_kv (query head h reads kv head h // n_rep),
                                    SwiGLU down(silu(gate(x)) * up(x)), untied lm_head unless absent

`tokens` is a [B, T + 1] integer array of windows: inputs tokens[:, :-1], targets tokens[:, 1:].
The loss is the mean cross-entropy over all B * T predicted tokens (natural log). Config values
that are not tensors (heads, kv heads, eps, rope theta) come from the caller: they are what
config.json would hold.
"""
import numpy as np


def _f64(tensors, name):
    return np.asarray(tensors[name], dtype=np.float64)


def _cross_entropy(logits, targets):
    """Mean of -log softmax(logits)[target] over every position; logits [B, T, V]."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=-1))
    picked = np.take_along_axis(shifted, targets[..., None], axis=-1)[..., 0]
    return float(np.mean(log_z - picked))


def _causal_attention(q, k, v):
    """q [B, H, T, D], k and v [B, H, T, D] -> [B, H, T, D], softmax(q k^T / sqrt(D)) causal."""
    d = q.shape[-1]
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    t = q.shape[-2]
    mask = np.triu(np.ones((t, t), dtype=bool), k=1)
    scores = np.where(mask, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _gelu_new(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_loss(tensors, tokens, heads, layer_norm_epsilon=1e-5):
    tokens = np.asarray(tokens, dtype=np.int64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    b, t = inputs.shape
    wte = _f64(tensors, "wte.weight")
    x = wte[inputs] + _f64(tensors, "wpe.weight")[np.arange(t)][None]
    c = x.shape[-1]
    d = c // heads
    layers = 0
    while f"h.{layers}.ln_1.weight" in tensors:
        layers += 1
    for i in range(layers):
        p = f"h.{i}."
        w = lambda name: _f64(tensors, p + name)  # noqa: E731
        h = _layer_norm(x, w("ln_1.weight"), w("ln_1.bias"), layer_norm_epsilon)
        qkv = h @ w("attn.c_attn.weight") + w("attn.c_attn.bias")  # Conv1D: [in, out]
        q, k, v = np.split(qkv, 3, axis=-1)
        split = lambda y: y.reshape(b, t, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
        a = _causal_attention(split(q), split(k), split(v)).transpose(0, 2, 1, 3).reshape(b, t, c)
        x = x + a @ w("attn.c_proj.weight") + w("attn.c_proj.bias")
        h = _layer_norm(x, w("ln_2.weight"), w("ln_2.bias"), layer_norm_epsilon)
        h = _gelu_new(h @ w("mlp.c_fc.weight") + w("mlp.c_fc.bias"))
        x = x + h @ w("mlp.c_proj.weight") + w("mlp.c_proj.bias")
    x = _layer_norm(x, _f64(tensors, "ln_f.weight"), _f64(tensors, "ln_f.bias"), layer_norm_epsilon)
    head = _f64(tensors, "lm_head.weight") if "lm_head.weight" in tensors else wte
    return _cross_entropy(x @ head.T, targets)


def _rms_norm(x, weight, eps):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * weight


def _rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def llama_loss(tensors, tokens, heads, kv_heads, rms_norm_eps, rope_theta):
    tokens = np.asarray(tokens, dtype=np.int64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    b, t = inputs.shape
    x = _f64(tensors, "model.embed_tokens.weight")[inputs]
    c = x.shape[-1]
    d = c // heads
    n_rep = heads // kv_heads
    inv_freq = 1.0 / (rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = np.outer(np.arange(t, dtype=np.float64), inv_freq)  # [T, D/2]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [T, D]
    cos, sin = np.cos(emb)[None, None], np.sin(emb)[None, None]
    layers = 0
    while f"model.layers.{layers}.input_layernorm.weight" in tensors:
        layers += 1
    for i in range(layers):
        p = f"model.layers.{i}."
        w = lambda name: _f64(tensors, p + name)  # noqa: E731
        h = _rms_norm(x, w("input_layernorm.weight"), rms_norm_eps)
        q = (h @ w("self_attn.q_proj.weight").T).reshape(b, t, heads, d).transpose(0, 2, 1, 3)
        k = (h @ w("self_attn.k_proj.weight").T).reshape(b, t, kv_heads, d).transpose(0, 2, 1, 3)
        v = (h @ w("self_attn.v_proj.weight").T).reshape(b, t, kv_heads, d).transpose(0, 2, 1, 3)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k = np.repeat(k, n_rep, axis=1)  # repeat_kv: kv head j serves query heads j*n_rep..
        v = np.repeat(v, n_rep, axis=1)
        a = _causal_attention(q, k, v).transpose(0, 2, 1, 3).reshape(b, t, heads * d)
        x = x + a @ w("self_attn.o_proj.weight").T
        h = _rms_norm(x, w("post_attention_layernorm.weight"), rms_norm_eps)
        gate = h @ w("mlp.gate_proj.weight").T
        up = h @ w("mlp.up_proj.weight").T
        x = x + (gate / (1.0 + np.exp(-gate)) * up) @ w("mlp.down_proj.weight").T
    x = _rms_norm(x, _f64(tensors, "model.norm.weight"), rms_norm_eps)
    head = (_f64(tensors, "lm_head.weight") if "lm_head.weight" in tensors
            else _f64(tensors, "model.embed_tokens.weight"))
    return _cross_entropy(x @ head.T, targets)
