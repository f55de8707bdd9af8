# SPDX-License-Identifier: MIT
"""The PyTorch twin of an mpx config, for the weights cross-checks in bench/.

Builds the network of an mpx YAML config in PyTorch (NCHW, float32) with the same
semantics as mpx (Keras "same" padding with the extra row/column at the bottom and
right, average pooling that excludes padding, batch norm with the config's epsilon,
the residual block's 1x1 projection named <block>_projection, softmax fused into
the loss), names every module as mpx names its layers (Keras style: conv2d,
conv2d_1, ...), and reads the data sets mpx reads (MNIST / Fashion-MNIST IDX,
plain or .gz; CIFAR-10 binary batches), normalized as mpx normalizes them.

The module's state_dict() keys are exactly the names of `mpx export --layout pytorch`
(<layer>.weight, .bias, .running_mean, .running_var).
"""
import gzip
import os
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import yaml

NUM_CLASSES = 10
DEFAULT_NORM = {
    "mnist": ([0.1307], [0.3081]),
    "fashion_mnist": ([0.2860], [0.3530]),
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]),
}


# ---- config ---------------------------------------------------------------------

def load_config(path):
    with open(path) as f:
        cfg = yaml.safe_load(f)
    assign_names(cfg["model"]["layers"])
    return cfg


def assign_names(layers):
    """mpx's default names: explicit ones are reserved, then <type>, <type>_1, ... in pre-order."""
    taken = set()

    def collect(ls):
        for l in ls:
            if l.get("name"):
                taken.add(l["name"])
            collect(l.get("layers", []))

    counters = {}

    def assign(ls):
        for l in ls:
            if not l.get("name"):
                k = counters.get(l["type"], 0)
                while True:
                    cand = l["type"] if k == 0 else f"{l['type']}_{k}"
                    k += 1
                    if cand not in taken:
                        break
                counters[l["type"]] = k
                l["name"] = cand
                taken.add(cand)
            assign(l.get("layers", []))

    collect(layers)
    assign(layers)


def pair(v, default):
    if v is None:
        return (default, default)
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def same_pad(n, k, s):
    out = (n + s - 1) // s
    total = max((out - 1) * s + k - n, 0)
    return total // 2, total - total // 2


# ---- layers ---------------------------------------------------------------------

def torch_activation(layer, inplace=False):
    """The PyTorch module of a layer's `activation` (lib/core/activation.h's names), or None
    for linear and softmax (the softmax is fused into the loss). Unknown names are errors."""
    act = layer.get("activation", "linear")
    if act in ("linear", "softmax"):
        return None
    make = {
        "relu": lambda: nn.ReLU(inplace=inplace),
        "leaky_relu": lambda: nn.LeakyReLU(float(layer.get("negative_slope", 0.2)), inplace=inplace),
        "gelu": lambda: nn.GELU(),
        "gelu_tanh": lambda: nn.GELU(approximate="tanh"),
        "silu": lambda: nn.SiLU(inplace=inplace),
        "swish": lambda: nn.SiLU(inplace=inplace),
    }
    if act not in make:
        raise ValueError(f"{layer.get('name', '?')}: activation {act} has no PyTorch twin here")
    return make[act]()


class Conv(nn.Module):
    def __init__(self, cin, k, kernel, stride, padding, bias, act, in_hw):
        super().__init__()
        self.conv = nn.Conv2d(cin, k, kernel, stride=stride, padding=0, bias=bias)
        self.act = act
        if padding == "same":
            t, b = same_pad(in_hw[0], kernel[0], stride[0])
            l, r = same_pad(in_hw[1], kernel[1], stride[1])
            self.pad = (l, r, t, b)
        else:
            self.pad = (0, 0, 0, 0)

    def forward(self, x):
        if any(self.pad):
            x = F.pad(x, self.pad)
        y = self.conv(x)
        return self.act(y) if self.act is not None else y


class Pool(nn.Module):
    def __init__(self, kind, size, stride, padding, in_hw):
        super().__init__()
        self.kind, self.size, self.stride = kind, size, stride
        if padding == "same":
            t, b = same_pad(in_hw[0], size[0], stride[0])
            l, r = same_pad(in_hw[1], size[1], stride[1])
            self.pad = (l, r, t, b)
        else:
            self.pad = (0, 0, 0, 0)

    def forward(self, x):
        if self.kind == "max_pool":
            if any(self.pad):
                x = F.pad(x, self.pad, value=float("-inf"))
            return F.max_pool2d(x, self.size, self.stride)
        if not any(self.pad):
            return F.avg_pool2d(x, self.size, self.stride)
        ones = torch.ones_like(x[:1, :1])
        s = F.avg_pool2d(F.pad(x, self.pad), self.size, self.stride)
        c = F.avg_pool2d(F.pad(ones, self.pad), self.size, self.stride)
        return s / c  # average over the window's valid elements only (Keras)


class Lambda(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


class Scale(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha

    def forward(self, x):
        return x * self.alpha


class Residual(nn.Module):
    def __init__(self, steps, proj):
        super().__init__()
        self.steps = steps  # names of the branch's modules, registered on the root
        self.proj = proj    # name of the projection module or None
        self.root = []      # [the root MpxNet]: a list, so it is not registered as a submodule

    def forward(self, x):
        root = self.root[0]
        h = x
        for n in self.steps:
            h = getattr(root, n)(h)
        s = getattr(root, self.proj)(x) if self.proj else x
        return h + s


class MpxNet(nn.Module):
    """Every layer is a direct child named like the mpx layer, so state_dict keys are <layer>.<param>.

    flatten: "nchw" (PyTorch's usual order; matches `--layout pytorch`) or "nhwc"
    (mpx/Keras order; matches `--layout keras` after transposing the kernels).
    """

    def __init__(self, cfg, input_hwc, flatten="nchw"):
        super().__init__()
        self.flatten_order = flatten
        self.top = []
        self.keras_transforms = {}  # parameter name -> how a keras-layout tensor becomes this module's
        shape = ("map", input_hwc[2], input_hwc[0], input_hwc[1])
        layers = cfg["model"]["layers"]
        self.top, shape = self._build(layers, shape, last=True)
        if shape != ("flat", NUM_CLASSES):
            raise ValueError(f"the last layer outputs {shape}, expected {NUM_CLASSES} classes")

    def _add(self, name, module):
        self.add_module(name, module)
        return name

    def _build(self, layers, shape, last):
        names = []
        for i, l in enumerate(layers):
            t = l["type"]
            name = l["name"]
            is_last = last and i == len(layers) - 1
            act = l.get("activation", "linear")
            if act == "softmax" and not is_last:
                raise ValueError(f"{name}: softmax is only supported on the last layer")
            am = torch_activation(l)
            if t == "conv2d":
                _, c, h, w = shape
                kernel = pair(l.get("kernel"), 3)
                stride = pair(l.get("strides", l.get("stride")), 1)
                padding = l.get("padding", "valid")
                m = Conv(c, int(l["filters"]), kernel, stride, padding, l.get("use_bias", True), am, (h, w))
                if padding == "same":
                    oh, ow = (h + stride[0] - 1) // stride[0], (w + stride[1] - 1) // stride[1]
                else:
                    oh, ow = (h - kernel[0]) // stride[0] + 1, (w - kernel[1]) // stride[1] + 1
                names.append(self._add(name, m))
                self.keras_transforms[name + ".conv.weight"] = ("conv", None)
                shape = ("map", int(l["filters"]), oh, ow)
            elif t == "dense":
                if shape[0] != "flat":
                    raise ValueError(f"{name}: dense needs a flat input")
                m = nn.Linear(shape[1], int(l["units"]), bias=l.get("use_bias", True))
                # output_scale: the output, after the bias, times a constant (docs/fast-cifar.md,
                # "Logits times a constant"); mpx allows it with linear or softmax only.
                tail = [Scale(float(l["output_scale"]))] if l.get("output_scale") is not None else []
                tail += [am] if am is not None else []
                names.append(self._add(name, nn.Sequential(m, *tail) if tail else m))
                self.keras_transforms[name + (".0" if tail else "") + ".weight"] = ("dense", None)
                shape = ("flat", int(l["units"]))
            elif t == "batch_norm":
                c = shape[1]
                eps = float(l.get("epsilon", 1e-3))
                m = nn.BatchNorm2d(c, eps=eps) if shape[0] == "map" else nn.BatchNorm1d(c, eps=eps)
                names.append(self._add(name, m))
            elif t == "activation":
                names.append(self._add(name, am if am is not None else nn.Identity()))
            elif t in ("max_pool", "avg_pool"):
                _, c, h, w = shape
                size = pair(l.get("pool_size", l.get("size")), 2)
                stride = pair(l.get("strides", l.get("stride")), None)
                stride = size if stride == (None, None) else stride
                padding = l.get("padding", "valid")
                names.append(self._add(name, Pool(t, size, stride, padding, (h, w))))
                if padding == "same":
                    oh, ow = (h + stride[0] - 1) // stride[0], (w + stride[1] - 1) // stride[1]
                else:
                    oh, ow = (h - size[0]) // stride[0] + 1, (w - size[1]) // stride[1] + 1
                shape = ("map", c, oh, ow)
            elif t == "global_avg_pool":
                names.append(self._add(name, Lambda(lambda x: x.mean(dim=(2, 3)))))
                shape = ("flat", shape[1])
            elif t == "flatten":
                if shape[0] == "map":
                    if self.flatten_order == "nhwc":
                        f = Lambda(lambda x: x.permute(0, 2, 3, 1).flatten(1))
                    else:
                        f = Lambda(lambda x: x.flatten(1))
                    shape = ("flat", shape[1] * shape[2] * shape[3])
                else:
                    f = nn.Identity()
                names.append(self._add(name, f))
            elif t == "dropout":
                names.append(self._add(name, nn.Dropout(float(l.get("rate", 0.5)))))
            elif t == "residual":
                inner, out = self._build(l["layers"], shape, last=False)
                proj = None
                if out != shape:
                    _, c, h, w = shape
                    _, k, oh, ow = out
                    sh, sw = (h + oh - 1) // oh, (w + ow - 1) // ow
                    proj = self._add(name + "_projection", Conv(c, k, (1, 1), (sh, sw), "valid", False, False, (h, w)))
                    self.keras_transforms[proj + ".conv.weight"] = ("conv", None)
                r = Residual(inner, proj)
                r.root.append(self)
                names.append(self._add(name, r))
                shape = out
            else:
                raise ValueError(f"{name}: unknown layer type {t}")
        return names, shape

    def forward(self, x):
        h = x
        for n in self.top:
            h = getattr(self, n)(h)
        return h

    # ---- weights in mpx's file names ---------------------------------------------

    def mpx_names(self):
        """state_dict key -> the name `mpx export --layout pytorch` uses (drops the wrapper levels)."""
        out = {}
        for k in self.state_dict():
            parts = k.split(".")
            layer, param = parts[0], parts[-1]
            out[k] = f"{layer}.{param}"
        return out

    def load_mpx(self, tensors, layout):
        """Loads an `mpx export` file's tensors (dict name -> tensor) in `layout` keras | pytorch."""
        bn_keras = {"weight": "gamma", "bias": "beta", "running_mean": "moving_mean", "running_var": "moving_variance"}
        sd = {}
        used = set()
        for k, v in self.state_dict().items():
            parts = k.split(".")
            layer, param = parts[0], parts[-1]
            if param == "num_batches_tracked":
                sd[k] = v
                continue
            mod = getattr(self, layer)
            if layout == "pytorch":
                name = f"{layer}.{param}"
                t = tensors[name]
            else:
                if isinstance(mod, (nn.BatchNorm1d, nn.BatchNorm2d)):
                    name = f"{layer}/{bn_keras[param]}"
                else:
                    name = f"{layer}/{'kernel' if param == 'weight' else param}"
                t = tensors[name]
                kind = self.keras_transforms.get(k, (None,))[0]
                if kind == "conv":
                    t = t.permute(3, 2, 0, 1)  # HWIO -> OIHW
                elif kind == "dense":
                    t = t.t()  # (in, out) -> (out, in)
            if tuple(t.shape) != tuple(v.shape):
                raise ValueError(f"{name}: file shape {tuple(t.shape)}, module expects {tuple(v.shape)}")
            sd[k] = t.contiguous().float()
            used.add(name)
        extra = set(tensors) - used - {n for n in tensors if n.endswith(".num_batches_tracked")}
        if extra:
            raise ValueError(f"tensors not in the model: {sorted(extra)}")
        self.load_state_dict(sd)

    def to_mpx(self):
        """The state_dict under mpx's pytorch-layout names (for safetensors.torch.save_file)."""
        names = self.mpx_names()
        return {names[k]: v.detach().contiguous() for k, v in self.state_dict().items()}

    def forward_cfg_input(self, images_u8_nhwc, mean, std):
        return self(normalize(images_u8_nhwc, mean, std))


# ---- data -----------------------------------------------------------------------

def _open(path):
    if os.path.exists(path):
        return open(path, "rb")
    if os.path.exists(path + ".gz"):
        return gzip.open(path + ".gz", "rb")
    raise FileNotFoundError(f"{path}(.gz) not found")


def read_idx_split(folder, split):
    prefix = "t10k" if split == "test" else "train"
    with _open(os.path.join(folder, f"{prefix}-images-idx3-ubyte")) as f:
        magic, n, h, w = struct.unpack(">IIII", f.read(16))
        images = np.frombuffer(f.read(n * h * w), dtype=np.uint8).reshape(n, h, w, 1)
    with _open(os.path.join(folder, f"{prefix}-labels-idx1-ubyte")) as f:
        magic, n2 = struct.unpack(">II", f.read(8))
        labels = np.frombuffer(f.read(n2), dtype=np.uint8).astype(np.int64)
    return images, labels


def read_cifar_split(folder, split):
    files = ["test_batch.bin"] if split == "test" else [f"data_batch_{i}.bin" for i in range(1, 6)]
    xs, ys = [], []
    for fn in files:
        p = os.path.join(folder, fn)
        if not os.path.exists(p):
            continue
        raw = np.fromfile(p, dtype=np.uint8).reshape(-1, 3073)
        ys.append(raw[:, 0].astype(np.int64))
        xs.append(raw[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
    if not xs:
        raise FileNotFoundError(f"no CIFAR-10 batches in {folder}")
    return np.concatenate(xs), np.concatenate(ys)


def read_split(dataset, folder, split="test", limit=0):
    if dataset in ("mnist", "fashion_mnist"):
        x, y = read_idx_split(folder, split)
    elif dataset == "cifar10":
        x, y = read_cifar_split(folder, split)
    else:
        raise ValueError(f"dataset {dataset} is not read by this script")
    if limit:
        x, y = x[:limit], y[:limit]
    return x, y


def normalization(cfg):
    d = cfg.get("data", {})
    norm = d.get("normalize") or {}
    if norm.get("mean") and norm.get("std"):
        return norm["mean"], norm["std"]
    return DEFAULT_NORM[d["dataset"]]


def normalize(images_u8_nhwc, mean, std):
    """mpx's normalize_input: x * (1 / (255 std)) - mean / std in float32, then NCHW."""
    x = torch.from_numpy(np.array(images_u8_nhwc, dtype=np.float32))
    m = torch.tensor(mean, dtype=torch.float32)
    s = torch.tensor(std, dtype=torch.float32)
    a = 1.0 / (255.0 * s)
    b = -m / s
    return (x * a + b).permute(0, 3, 1, 2).contiguous()


def input_hwc(cfg, images):
    s = cfg.get("model", {}).get("input_shape")
    if s:
        return tuple(int(v) for v in s)
    return images.shape[1], images.shape[2], images.shape[3]
