# SPDX-License-Identifier: MIT
"""The tf-keras 2.x twin of an mpx config, for bench/keras_parity.py (docs/keras-parity.md).

Builds the network of an mpx YAML config with the Keras functional API, every
layer named as mpx names it (conv2d, conv2d_1, depthwise_conv2d, ..., <block>_projection) and
with the config's policy and per-layer `dtype:`; reads the data sets as mpx
reads them (MNIST / Fashion-MNIST IDX, plain or .gz; CIFAR-10 binary batches)
and normalizes them with mpx's float32 formula. Needs TF_USE_LEGACY_KERAS=1,
tensorflow and tf-keras (bench/keras_setup.sh). Not a dependency of mpx.
"""
import gzip
import os
import struct

import numpy as np
import yaml

DEFAULT_NORM = {
    "mnist": ([0.1307], [0.3081]),
    "fashion_mnist": ([0.2860], [0.3530]),
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
}
# mpx layer dtype -> Keras dtype policy name
KERAS_POLICY = {"float32": "float32", "float16": "mixed_float16", "mixed_float16": "mixed_float16",
                "bfloat16": "mixed_bfloat16", "mixed_bfloat16": "mixed_bfloat16"}


# ---- config -------------------------------------------------------------------------

def load_config(path):
    with open(path) as f:
        cfg = yaml.safe_load(f)
    assign_names(cfg["model"]["layers"])
    return cfg


def assign_names(layers):
    """mpx's default names (docs/weights.md): explicit names are reserved first, then
    <type>, <type>_1, ... in pre-order over nested blocks."""
    taken, counters = set(), {}

    def collect(ls):
        for l in ls:
            if l.get("name"):
                taken.add(l["name"])
            collect(l.get("layers", []))

    def assign(ls):
        for l in ls:
            if not l.get("name"):
                k = counters.get(l["type"], 0)
                cand = l["type"] if k == 0 else f"{l['type']}_{k}"
                while cand in taken:
                    k += 1
                    cand = f"{l['type']}_{k}"
                counters[l["type"]] = k + 1
                l["name"] = cand
            taken.add(l["name"])
            assign(l.get("layers", []))

    collect(layers)
    assign(layers)


def hw(v, default):
    if v is None:
        return (default, default)
    return (int(v[0]), int(v[1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


# ---- data -----------------------------------------------------------------------------

def _read_maybe_gz(path):
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    with gzip.open(path + ".gz", "rb") as f:
        return f.read()


def read_train(dataset, folder, limit):
    """The first `limit` training records in file order: uint8 NHWC images and int labels."""
    if dataset in ("mnist", "fashion_mnist"):
        img = _read_maybe_gz(os.path.join(folder, "train-images-idx3-ubyte"))
        lab = _read_maybe_gz(os.path.join(folder, "train-labels-idx1-ubyte"))
        n, rows, cols = struct.unpack(">III", img[4:16])
        n = min(n, limit)
        x = np.frombuffer(img, np.uint8, n * rows * cols, 16).reshape(n, rows, cols, 1)
        return x, np.frombuffer(lab, np.uint8, n, 8).astype(np.int64)
    if dataset == "cifar10":
        xs, ys, left = [], [], limit
        base = folder if os.path.exists(os.path.join(folder, "data_batch_1.bin")) else \
            os.path.join(folder, "cifar-10-batches-bin")
        for i in range(1, 6):
            path = os.path.join(base, f"data_batch_{i}.bin")
            if left <= 0 or not os.path.exists(path):
                break
            raw = np.fromfile(path, np.uint8).reshape(-1, 3073)[:left]
            ys.append(raw[:, 0].astype(np.int64))
            xs.append(raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            left -= len(raw)
        return np.concatenate(xs), np.concatenate(ys)
    raise SystemExit(f"data.dataset {dataset}: the Keras twin reads mnist, fashion_mnist and cifar10 only")


def normalize(images, cfg):
    """mpx's input normalization (lib/backend/cpu/elementwise/cast.cpp): x * (1 / (255 std)) + (-mean / std), float32."""
    norm = cfg["data"].get("normalize") or {}
    mean, std = DEFAULT_NORM.get(cfg["data"]["dataset"], ([0.0], [1.0]))
    mean = np.asarray(norm.get("mean", mean), np.float32)
    std = np.asarray(norm.get("std", std), np.float32)
    a = np.float32(1.0) / (np.float32(255.0) * std)
    b = -mean / std
    return images.astype(np.float32) * a + b


# ---- the network ----------------------------------------------------------------------

def _layer_policy(layer, inherited, policy):
    d = layer.get("dtype") or inherited
    return KERAS_POLICY[d] if d else policy


def _build(keras, x, layers, policy, inherited, last_of_model):
    L = keras.layers
    for i, l in enumerate(layers):
        t, name = l["type"], l["name"]
        pol = _layer_policy(l, inherited, policy)
        last = last_of_model and i == len(layers) - 1
        act = l.get("activation", "linear")
        if act == "softmax":
            if not last:
                raise SystemExit(f"{name}: softmax is only fused into the loss on the last layer")
            act = "linear"  # the twin, like mpx, fuses the softmax into a from-logits loss
        if act not in ("linear", "relu", "gelu", "silu", "swish", "gelu_tanh", "leaky_relu"):
            raise SystemExit(f"{name}: activation {act} has no Keras twin here")
        kw = dict(name=name, dtype=pol)
        if t == "conv2d":
            x = L.Conv2D(int(l["filters"]), hw(l.get("kernel"), 3), strides=hw(l.get("strides", l.get("stride")), 1),
                         padding=l.get("padding", "valid"), use_bias=l.get("use_bias", True), **kw)(x)
            x = _activation(keras, x, l, act, pol)
        elif t == "depthwise_conv2d":
            x = L.DepthwiseConv2D(hw(l.get("kernel"), 3), strides=hw(l.get("strides", l.get("stride")), 1),
                                  padding=l.get("padding", "valid"), depth_multiplier=int(l.get("depth_multiplier", 1)),
                                  use_bias=l.get("use_bias", True), **kw)(x)
            x = _activation(keras, x, l, act, pol)
        elif t == "dense":
            x = L.Dense(int(l["units"]), use_bias=l.get("use_bias", True), **kw)(x)
            x = _activation(keras, x, l, act, pol)
        elif t == "activation":
            x = _activation(keras, x, l, act, pol, name=name)
        elif t in ("max_pool", "avg_pool"):
            size = hw(l.get("pool_size", l.get("size")), 2)
            given = l.get("strides", l.get("stride"))
            strides = hw(given, 1) if given is not None else size
            cls = L.MaxPooling2D if t == "max_pool" else L.AveragePooling2D
            x = cls(size, strides=strides, padding=l.get("padding", "valid"), **kw)(x)
        elif t == "global_avg_pool":
            x = L.GlobalAveragePooling2D(**kw)(x)
        elif t == "flatten":
            x = L.Flatten(**kw)(x)
        elif t == "dropout":
            x = L.Dropout(0.0, **kw)(x)  # off for the comparison (mpx gets rate 0 too)
        elif t == "batch_norm":
            x = L.BatchNormalization(momentum=float(l.get("momentum", 0.99)), epsilon=float(l.get("epsilon", 1e-3)),
                                     **kw)(x)
        elif t == "residual":
            branch = _build(keras, x, l["layers"], policy, l.get("dtype") or inherited, False)
            short = x
            if tuple(branch.shape[1:]) != tuple(x.shape[1:]):
                s = ((x.shape[1] + branch.shape[1] - 1) // branch.shape[1],
                     (x.shape[2] + branch.shape[2] - 1) // branch.shape[2])
                short = L.Conv2D(branch.shape[-1], 1, strides=s, padding="valid", use_bias=False,
                                 name=name + "_projection", dtype=pol)(x)
            x = L.Add(**kw)([short, branch])
        else:
            raise SystemExit(f"{name}: layer type {t} has no Keras twin here")
    return x


def _activation(keras, x, l, act, pol, name=None):
    if act == "linear" and name is None:
        return x
    nm = name or (l["name"] + "_act")
    if act == "leaky_relu":
        return keras.layers.LeakyReLU(float(l.get("negative_slope", 0.2)), name=nm, dtype=pol)(x)
    if act == "gelu_tanh":
        return keras.layers.Activation(lambda v: keras.activations.gelu(v, approximate=True), name=nm, dtype=pol)(x)
    return keras.layers.Activation("silu" if act == "swish" else act, name=nm, dtype=pol)(x)


def build_model(keras, cfg, policy, input_hwc):
    """A Keras model whose output is the float32 logits (the softmax of the last layer is
    left to a from-logits loss, as mpx fuses it into the cross-entropy)."""
    inp = keras.Input(shape=tuple(input_hwc), dtype="float32", name="images")
    out = _build(keras, inp, cfg["model"]["layers"], policy, None, True)
    return keras.Model(inp, out, name=cfg.get("name", "twin"))


def keras_weights(model):
    """Every variable in the keras layout of docs/weights.md: <layer>/<kernel|bias|gamma|beta|moving_*>."""
    out = {}
    for layer in model.layers:
        for v in layer.weights:
            short = v.name.split("/")[-1].split(":")[0]
            out[f"{layer.name}/{short}"] = np.ascontiguousarray(v.numpy().astype(np.float32))
    return out
