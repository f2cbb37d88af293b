"""Sequence models written with raw tf.compat.v1 ops: Transformer encoder, BERT, LSTM LM, GNMT.

Everything is spelled out with MatMul/BatchMatMul, softmax and elementwise ops (no Keras
layers, no ``tf.while_loop``): recurrences are unrolled in Python, so every time step is a
separate set of ops that a placer can move. Float variables and computations use ``dtype``;
token placeholders ("tokens", "targets", "decoder_tokens") are int32.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from fastt.errors import FasttError
from fastt.zoo import TrainingGraph, optimizer, register

_tf1 = tf.compat.v1


# --- shared pieces -------------------------------------------------------------------------

def _training_graph(name: str, body: Callable[[], Any], feeds: dict[str, np.ndarray],
                    opt: str, seed: int) -> TrainingGraph:
    """Build ``loss = body()`` in a fresh graph with the graph-level seed and an optimizer."""
    g = tf.Graph()
    with g.as_default():
        _tf1.set_random_seed(seed)
        loss = body()
        train_op = optimizer(opt).minimize(
            loss, global_step=_tf1.train.get_or_create_global_step(),
            colocate_gradients_with_ops=True)
        init = _tf1.group(_tf1.global_variables_initializer(), _tf1.local_variables_initializer())
    return TrainingGraph(name, g, loss, train_op, init, feeds)


def _check_dtype(dtype: Any) -> tf.DType:
    dtype = tf.as_dtype(dtype)
    if not dtype.is_floating:
        raise FasttError(f"dtype must be a floating type, got {dtype.name}")
    return dtype


def _positive(**sizes: int) -> None:
    for k, v in sizes.items():
        if int(v) < 1:
            raise FasttError(f"{k} must be at least 1, got {v}")


def _lm_feeds(rng: np.random.RandomState, batch_size: int, seq_len: int,
              vocab: int) -> dict[str, np.ndarray]:
    """Tokens and the same sequence shifted by one as targets (next-token prediction)."""
    seq = rng.randint(0, vocab, (batch_size, seq_len + 1)).astype(np.int32)
    return {"tokens": seq[:, :-1].copy(), "targets": seq[:, 1:].copy()}


def _embedding(tokens: Any, vocab: int, dim: int, dtype: tf.DType, name: str,
               stddev: float | None = None) -> Any:
    """``tf.gather`` of the token ids from a [vocab, dim] variable."""
    init = _tf1.random_normal_initializer(0.0, stddev) if stddev else None
    table = _tf1.get_variable(name, [vocab, dim], dtype=dtype, initializer=init)
    return tf.gather(table, tokens)


def _dense(x: Any, units: int, name: str, bias: bool = True) -> Any:
    """``x @ W (+ b)`` for a 2-D ``x``, in ``x``'s dtype."""
    dtype = x.dtype.base_dtype
    with _tf1.variable_scope(name):
        w = _tf1.get_variable("weights", [int(x.shape[-1]), units], dtype=dtype)
        y = tf.matmul(x, w)
        if bias:
            b = _tf1.get_variable("biases", [units], dtype=dtype,
                                  initializer=_tf1.zeros_initializer())
            y = tf.nn.bias_add(y, b)
        return y


def _token_loss(logits: Any, targets: Any) -> Any:
    """Sparse softmax cross-entropy per token, averaged over every token of the batch."""
    xent = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.reshape(targets, [-1]), logits=logits)
    return tf.reduce_mean(xent, name="loss")


# --- LSTM ----------------------------------------------------------------------------------

def lstm_params(in_dim: int, hidden: int, dtype: tf.DType, name: str) -> tuple[Any, Any]:
    """The [in_dim + hidden, 4 * hidden] kernel and [4 * hidden] bias of one LSTM layer."""
    with _tf1.variable_scope(name):
        kernel = _tf1.get_variable("kernel", [in_dim + hidden, 4 * hidden], dtype=dtype)
        bias = _tf1.get_variable("bias", [4 * hidden], dtype=dtype,
                                 initializer=_tf1.zeros_initializer())
    return kernel, bias


def lstm_cell(x: Any, h: Any, c: Any, kernel: Any, bias: Any,
              forget_bias: float = 1.0) -> tuple[Any, Any]:
    """One LSTM step: a single matmul of [x, h], then sigmoid/tanh gates. Returns (h, c)."""
    gates = tf.nn.bias_add(tf.matmul(tf.concat([x, h], 1), kernel), bias)
    i, j, f, o = tf.split(gates, 4, axis=1)
    c = tf.sigmoid(f + forget_bias) * c + tf.sigmoid(i) * tf.tanh(j)
    return tf.sigmoid(o) * tf.tanh(c), c


def lstm_layer(inputs: list[Any], hidden: int, name: str, reverse: bool = False) -> list[Any]:
    """Unroll one LSTM layer over the list of [batch, in] inputs; returns the outputs in
    input order (``reverse`` runs the recurrence from the last step to the first)."""
    batch, dtype = int(inputs[0].shape[0]), inputs[0].dtype.base_dtype
    kernel, bias = lstm_params(int(inputs[0].shape[-1]), hidden, dtype, name)
    with tf.name_scope(name):
        h = c = tf.zeros([batch, hidden], dtype)
        steps = range(len(inputs) - 1, -1, -1) if reverse else range(len(inputs))
        outputs: list[Any] = [None] * len(inputs)
        for t in steps:
            with tf.name_scope(f"t{t}"):
                h, c = lstm_cell(inputs[t], h, c, kernel, bias)
            outputs[t] = h
    return outputs


@register("lstm_lm")
def lstm_lm(layers: int = 2, hidden: int = 64, seq_len: int = 10, vocab: int = 100,
            batch_size: int = 8, opt: str = "sgd", seed: int = 0,
            dtype: Any = tf.float32) -> TrainingGraph:
    """Stacked LSTM language model unrolled over ``seq_len`` steps (next-token loss)."""
    _positive(layers=layers, hidden=hidden, seq_len=seq_len, vocab=vocab, batch_size=batch_size)
    dtype = _check_dtype(dtype)

    def body() -> Any:
        tokens = _tf1.placeholder(tf.int32, [batch_size, seq_len], name="tokens")
        targets = _tf1.placeholder(tf.int32, [batch_size, seq_len], name="targets")
        x = _embedding(tokens, vocab, hidden, dtype, "embedding")
        steps = tf.unstack(x, axis=1)
        for i in range(layers):
            steps = lstm_layer(steps, hidden, f"layer_{i}")
        out = tf.reshape(tf.stack(steps, axis=1), [batch_size * seq_len, hidden])
        return _token_loss(_dense(out, vocab, "softmax"), targets)

    feeds = _lm_feeds(np.random.RandomState(seed), batch_size, seq_len, vocab)
    return _training_graph("lstm_lm", body, feeds, opt, seed)


# --- Transformer ---------------------------------------------------------------------------

def positional_encoding(seq_len: int, d_model: int) -> np.ndarray:
    """The sinusoidal [seq_len, d_model] table of "Attention is all you need"."""
    pos = np.arange(seq_len)[:, None].astype(np.float64)
    i = np.arange(d_model)[None, :]
    angle = pos / np.power(10000.0, (2 * (i // 2)) / d_model)
    return np.where(i % 2 == 0, np.sin(angle), np.cos(angle))


def layer_norm(x: Any, name: str, eps: float = 1e-6) -> Any:
    """Normalize the last axis with ``tf.nn.moments``, then scale and shift."""
    dtype, dim = x.dtype.base_dtype, int(x.shape[-1])
    with _tf1.variable_scope(name):
        gamma = _tf1.get_variable("gamma", [dim], dtype=dtype, initializer=_tf1.ones_initializer())
        beta = _tf1.get_variable("beta", [dim], dtype=dtype, initializer=_tf1.zeros_initializer())
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + eps) * gamma + beta


def self_attention(x: Any, batch: int, seq_len: int, heads: int, name: str) -> Any:
    """Multi-head scaled dot-product self-attention of x: [batch * seq_len, d_model]."""
    d_model = int(x.shape[-1])
    depth = d_model // heads

    def split(t: Any) -> Any:  # [B*T, D] -> [B, H, T, D/H]
        return tf.transpose(tf.reshape(t, [batch, seq_len, heads, depth]), [0, 2, 1, 3])

    with _tf1.variable_scope(name):
        q, k, v = (split(_dense(x, d_model, n)) for n in ("query", "key", "value"))
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(depth))
        ctx = tf.matmul(tf.nn.softmax(scores), v)  # [B, H, T, D/H]
        ctx = tf.reshape(tf.transpose(ctx, [0, 2, 1, 3]), [batch * seq_len, d_model])
        return _dense(ctx, d_model, "output")


def feed_forward(x: Any, d_ff: int, name: str, activation: Callable[[Any], Any] = tf.nn.relu
                 ) -> Any:
    """Position-wise ``activation(x W1 + b1) W2 + b2``."""
    with _tf1.variable_scope(name):
        return _dense(activation(_dense(x, d_ff, "inner")), int(x.shape[-1]), "outer")


def encoder_stack(x: Any, layers: int, batch: int, seq_len: int, heads: int, d_ff: int,
                  activation: Callable[[Any], Any] = tf.nn.relu) -> Any:
    """``layers`` post-norm residual blocks (self-attention, feed-forward) on x: [B*T, D]."""
    for i in range(layers):
        with _tf1.variable_scope(f"layer_{i}"):
            a = self_attention(x, batch, seq_len, heads, "attention")
            x = layer_norm(x + a, "attention_norm")
            x = layer_norm(x + feed_forward(x, d_ff, "ffn", activation), "ffn_norm")
    return x


def _check_heads(d_model: int, heads: int) -> None:
    if d_model % heads:
        raise FasttError(f"d_model ({d_model}) must be a multiple of heads ({heads})")


@register("transformer")
def transformer(layers: int = 2, d_model: int = 64, heads: int = 4, d_ff: int = 128,
                seq_len: int = 16, vocab: int = 100, batch_size: int = 4, opt: str = "adam",
                seed: int = 0, dtype: Any = tf.float32) -> TrainingGraph:
    """Transformer encoder stack (post-norm residual blocks) with a per-token softmax.

    The base model of Vaswani et al. is layers=6, d_model=512, heads=8, d_ff=2048.
    """
    _positive(layers=layers, d_model=d_model, heads=heads, d_ff=d_ff, seq_len=seq_len,
              vocab=vocab, batch_size=batch_size)
    _check_heads(d_model, heads)
    dtype = _check_dtype(dtype)

    def body() -> Any:
        tokens = _tf1.placeholder(tf.int32, [batch_size, seq_len], name="tokens")
        targets = _tf1.placeholder(tf.int32, [batch_size, seq_len], name="targets")
        x = _embedding(tokens, vocab, d_model, dtype, "embedding", stddev=d_model ** -0.5)
        pe = tf.constant(positional_encoding(seq_len, d_model), dtype, name="positional")
        x = tf.reshape(x * math.sqrt(d_model) + pe, [batch_size * seq_len, d_model])
        x = encoder_stack(x, layers, batch_size, seq_len, heads, d_ff)
        return _token_loss(_dense(x, vocab, "logits"), targets)

    feeds = _lm_feeds(np.random.RandomState(seed), batch_size, seq_len, vocab)
    return _training_graph("transformer", body, feeds, opt, seed)


@register("bert")
def bert(layers: int = 24, d_model: int = 1024, heads: int = 16, d_ff: int = 4096,
         seq_len: int = 64, vocab: int = 30522, predictions: int | None = None,
         batch_size: int = 4, opt: str = "adam", seed: int = 0,
         dtype: Any = tf.float32) -> TrainingGraph:
    """BERT's encoder with its masked-language-model loss (defaults: BERT-large, depth
    configurable): token and learned position embeddings, GELU feed-forward blocks, and the
    vocabulary softmax at ``predictions`` masked positions per sequence (default 15%)."""
    predictions = predictions or max(1, (15 * seq_len) // 100)
    _positive(layers=layers, d_model=d_model, heads=heads, d_ff=d_ff, seq_len=seq_len,
              vocab=vocab, batch_size=batch_size, predictions=predictions)
    _check_heads(d_model, heads)
    if predictions > seq_len:
        raise FasttError(f"predictions ({predictions}) cannot exceed seq_len ({seq_len})")
    dtype = _check_dtype(dtype)

    def body() -> Any:
        tokens = _tf1.placeholder(tf.int32, [batch_size, seq_len], name="tokens")
        positions = _tf1.placeholder(tf.int32, [batch_size, predictions], name="positions")
        targets = _tf1.placeholder(tf.int32, [batch_size, predictions], name="targets")
        init = _tf1.truncated_normal_initializer(stddev=0.02)
        x = _embedding(tokens, vocab, d_model, dtype, "embedding", stddev=0.02)
        pos = _tf1.get_variable("position_embedding", [seq_len, d_model], dtype=dtype,
                                initializer=init)
        x = layer_norm(tf.reshape(x + pos, [batch_size * seq_len, d_model]), "embedding_norm")
        x = encoder_stack(x, layers, batch_size, seq_len, heads, d_ff, tf.nn.gelu)
        picked = tf.gather(tf.reshape(x, [batch_size, seq_len, d_model]), positions,
                           batch_dims=1)  # [B, P, D]
        flat = tf.reshape(picked, [batch_size * predictions, d_model])
        with _tf1.variable_scope("mlm"):
            h = layer_norm(tf.nn.gelu(_dense(flat, d_model, "transform")), "norm")
        return _token_loss(_dense(h, vocab, "logits"), targets)

    rng = np.random.RandomState(seed)
    feeds = {"tokens": rng.randint(0, vocab, (batch_size, seq_len)).astype(np.int32),
             "positions": np.sort(np.stack([rng.choice(seq_len, predictions, replace=False)
                                            for _ in range(batch_size)]), 1).astype(np.int32),
             "targets": rng.randint(0, vocab, (batch_size, predictions)).astype(np.int32)}
    return _training_graph("bert", body, feeds, opt, seed)


# --- GNMT ----------------------------------------------------------------------------------

def _attention_context(query: Any, memory: Any, keys: Any, kind: str) -> Any:
    """Context vector [B, M] of one decoder step over memory [B, S, M].

    Luong ("general"): score = q W . m, with ``keys = memory W`` precomputed as [B, S, H].
    Bahdanau (additive): score = v . tanh(m W1 + q W2), with ``keys = memory W1``.
    """
    if kind == "luong":
        scores = tf.matmul(tf.expand_dims(query, 1), keys, transpose_b=True)  # [B, 1, S]
    else:
        batch, src, hidden = (int(d) for d in keys.shape)
        hid = tf.tanh(keys + tf.expand_dims(_dense(query, hidden, "query", bias=False), 1))
        v = _tf1.get_variable("v", [hidden, 1], dtype=keys.dtype.base_dtype)
        scores = tf.reshape(tf.matmul(tf.reshape(hid, [batch * src, hidden]), v), [batch, 1, src])
    weights = tf.nn.softmax(scores)
    return tf.squeeze(tf.matmul(weights, memory), 1)


@register("gnmt")
def gnmt(layers: int = 2, hidden: int = 64, src_len: int = 10, tgt_len: int = 10,
         src_vocab: int = 100, tgt_vocab: int = 100, batch_size: int = 8,
         attention: str = "luong", opt: str = "sgd", seed: int = 0,
         dtype: Any = tf.float32) -> TrainingGraph:
    """GNMT-style encoder-decoder, every LSTM unrolled with raw ops.

    Encoder: bidirectional first layer, unidirectional layers above it (residual from the
    third layer on). Decoder: stacked LSTM with input feeding; at each step the top output
    attends over the encoder outputs (``attention`` "luong" or "bahdanau") and
    ``tanh(W [context, h])`` feeds the output softmax and the next step.
    """
    _positive(layers=layers, hidden=hidden, src_len=src_len, tgt_len=tgt_len,
              src_vocab=src_vocab, tgt_vocab=tgt_vocab, batch_size=batch_size)
    if attention not in ("luong", "bahdanau"):
        raise FasttError(f"unknown attention {attention!r} (choose luong or bahdanau)")
    dtype = _check_dtype(dtype)

    def encoder(tokens: Any) -> Any:
        with _tf1.variable_scope("encoder"):
            steps = tf.unstack(_embedding(tokens, src_vocab, hidden, dtype, "embedding"), axis=1)
            fw = lstm_layer(steps, hidden, "layer_0_fw")
            bw = lstm_layer(steps, hidden, "layer_0_bw", reverse=True)
            steps = [tf.concat([f, b], 1) for f, b in zip(fw, bw)]
            for i in range(1, layers):
                out = lstm_layer(steps, hidden, f"layer_{i}")
                steps = [o + s for o, s in zip(out, steps)] if i >= 2 else out
            return tf.stack(steps, axis=1)  # [B, S, M]

    def decoder(tokens: Any, memory: Any) -> Any:
        mem_dim = int(memory.shape[-1])
        with _tf1.variable_scope("decoder"):
            emb = tf.unstack(_embedding(tokens, tgt_vocab, hidden, dtype, "embedding"), axis=1)
            params = [lstm_params(2 * hidden if i == 0 else hidden, hidden, dtype, f"layer_{i}")
                      for i in range(layers)]
            with _tf1.variable_scope("attention"):
                flat = tf.reshape(memory, [batch_size * src_len, mem_dim])
                keys = tf.reshape(_dense(flat, hidden, "memory", bias=False),
                                  [batch_size, src_len, hidden])
                w_out = _tf1.get_variable("output", [mem_dim + hidden, hidden], dtype=dtype)
            zeros = tf.zeros([batch_size, hidden], dtype)
            state = [(zeros, zeros)] * layers
            feed, outputs = zeros, []
            for t in range(tgt_len):
                with tf.name_scope(f"t{t}"):
                    x = tf.concat([emb[t], feed], 1)
                    for i, (kernel, bias) in enumerate(params):
                        with tf.name_scope(f"layer_{i}"):
                            h, c = lstm_cell(x, *state[i], kernel, bias)
                        state[i] = (h, c)
                        x = h + x if i >= 2 else h
                    with _tf1.variable_scope("attention", reuse=t > 0):
                        ctx = _attention_context(x, memory, keys, attention)
                        feed = tf.tanh(tf.matmul(tf.concat([ctx, x], 1), w_out))
                outputs.append(feed)
            return tf.reshape(tf.stack(outputs, axis=1), [batch_size * tgt_len, hidden])

    def body() -> Any:
        src = _tf1.placeholder(tf.int32, [batch_size, src_len], name="tokens")
        dec = _tf1.placeholder(tf.int32, [batch_size, tgt_len], name="decoder_tokens")
        targets = _tf1.placeholder(tf.int32, [batch_size, tgt_len], name="targets")
        out = decoder(dec, encoder(src))
        return _token_loss(_dense(out, tgt_vocab, "softmax"), targets)

    rng = np.random.RandomState(seed)
    tgt = rng.randint(1, tgt_vocab, (batch_size, tgt_len)).astype(np.int32)
    feeds = {"tokens": rng.randint(0, src_vocab, (batch_size, src_len)).astype(np.int32),
             "decoder_tokens": np.concatenate(  # id 0 starts every target sentence
                 [np.zeros((batch_size, 1), np.int32), tgt[:, :-1]], axis=1),
             "targets": tgt}
    return _training_graph("gnmt", body, feeds, opt, seed)
