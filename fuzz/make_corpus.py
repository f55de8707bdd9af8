#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpora of the libFuzzer targets into fuzz/corpus/<target>/:
small valid files of each format and the malformed cases found so far
(docs/testing.md, "Fuzzing"). The checkpoint and safetensors seeds are copied
from files an mpx run wrote (fuzz/seeds/: `mpx train --config fuzz/seeds/seed_run.yaml`
then `mpx export`, keras and pytorch layouts). Inputs that a fuzzing run found (named after
the defect, e.g. fuzz_config/alias-bomb-near-node-limit) are kept in the corpus as found; this
script leaves them. Run from the repository root:
    python3 fuzz/make_corpus.py
"""
import gzip
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def config_seeds():
    cfgs = os.path.join(ROOT, "..", "configs")
    for name in ("mnist_smoke.yaml", "cifar10_resnet.yaml"):
        with open(os.path.join(cfgs, name), "rb") as f:
            put("fuzz_config", name, f.read())
    small = ("name: s\ndevice: cpu\ndata: {dataset: synthetic, batch_size: 8}\n"
             "model:\n  layers:\n    - {type: conv2d, filters: 4, kernel: 3, activation: relu}\n"
             "    - {type: max_pool, pool: 2}\n    - {type: flatten}\n"
             "    - {type: dense, units: 10, activation: softmax}\n")
    put("fuzz_config", "small.yaml", small)
    # YAML text, then NUL-separated --set strings.
    put("fuzz_config", "set_values.bin", small + "\0optimizer.learning_rate=3e-3\0model.layers[0].filters=64"
        "\0schedule.name=cosine\0loss_scale.mode=dynamic")
    put("fuzz_config", "set_bad.bin", small + "\0model.layers[9].units=3\0optimizer=\0=1\0data.batch_size=[1, 2]")
    bomb = "a0: &a0 [x, x, x, x, x, x, x, x, x]\n"
    for i in range(1, 9):
        bomb += "a%d: &a%d [%s]\n" % (i, i, ", ".join(["*a%d" % (i - 1)] * 9))
    put("fuzz_config", "alias_bomb.yaml", bomb)
    put("fuzz_config", "alias_bomb_set.bin", small + "\0name=" + "[*a, *a]")
    put("fuzz_config", "second_doc.yaml", small + "---\nname: other\n")
    put("fuzz_config", "latin1.yaml", small.replace("name: s", "name: caf\xe9").encode("latin-1"))
    put("fuzz_config", "tiny_lr.yaml", small + "optimizer: {learning_rate: 1e-320}\n")
    put("fuzz_config", "bn_eps.yaml", small.replace("- {type: flatten}", "- {type: batch_norm, epsilon: 1e-300}\n"
                                                    "    - {type: flatten}"))


def idx(magic, dims, payload):
    return struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload


def idx_seeds():
    # Byte 0: even = the images file, odd = the labels file (fuzz_idx.cpp).
    images = idx(0x803, [3, 28, 28], bytes(range(256)) * 9 + bytes(3 * 784 - 2304))
    labels = idx(0x801, [3], b"\x01\x07\x09")
    put("fuzz_idx", "images.bin", b"\0" + images)
    put("fuzz_idx", "images_gz.bin", b"\0" + gzip.compress(images, mtime=0))
    put("fuzz_idx", "labels.bin", b"\1" + labels)
    put("fuzz_idx", "labels_gz.bin", b"\1" + gzip.compress(labels, mtime=0))
    put("fuzz_idx", "images_two_members.bin",
        b"\0" + gzip.compress(images[:100], mtime=0) + gzip.compress(images[100:], mtime=0))
    put("fuzz_idx", "count_2e31.bin", b"\0" + idx(0x803, [1 << 31, 28, 28], bytes(80)))
    put("fuzz_idx", "truncated.bin", b"\0" + images[:500])
    put("fuzz_idx", "trailing.bin", b"\1" + labels + b"extra")
    put("fuzz_idx", "gz_garbage_after.bin", b"\1" + gzip.compress(labels, mtime=0) + b"garbage")
    put("fuzz_idx", "gz_bomb.bin", b"\0" + gzip.compress(idx(0x803, [3, 28, 28], bytes(3 * 784 + 200000)), mtime=0))
    put("fuzz_idx", "gz_twice.bin", b"\1" + gzip.compress(gzip.compress(labels, mtime=0), mtime=0))
    put("fuzz_idx", "bad_label.bin", b"\1" + idx(0x801, [3], b"\x01\x0b\x09"))
    put("fuzz_idx", "huge_image.bin", b"\0" + idx(0x803, [1, 60000, 60000], bytes(16)))


def cifar_seeds():
    rec = bytes([3]) + bytes((i * 7) % 256 for i in range(3072))
    put("fuzz_cifar", "one_record.bin", rec)
    put("fuzz_cifar", "two_records.bin", rec + bytes([9]) + rec[1:])
    put("fuzz_cifar", "bad_label.bin", bytes([10]) + rec[1:])
    put("fuzz_cifar", "short.bin", rec[:3000])
    put("fuzz_cifar", "empty.bin", b"")
    put("fuzz_cifar", "gzip.bin", gzip.compress(rec, mtime=0))


def copy_seeds(target, names):
    for name in names:
        with open(os.path.join(ROOT, "seeds", name), "rb") as f:
            data = f.read()
        stem = name.rsplit(".", 1)[0]
        put(target, name, data)
        put(target, stem + "_truncated.bin", data[: len(data) // 2])
        flipped = bytearray(data)
        flipped[len(data) // 3] ^= 0x10
        put(target, stem + "_bitflip.bin", bytes(flipped))


def checkpoint_seeds():
    copy_seeds("fuzz_checkpoint", ["last.ckpt"])
    with open(os.path.join(ROOT, "seeds", "last.ckpt"), "rb") as f:
        data = f.read()
    put("fuzz_checkpoint", "header_len_huge.bin", data[:12] + struct.pack("<I", 0xFFFFFFF0) + data[16:])
    put("fuzz_checkpoint", "header_only.bin", data[:64])


def safetensors_seeds():
    copy_seeds("fuzz_safetensors", ["keras.safetensors", "pytorch.safetensors"])
    def st(header, data=b""):
        h = header.encode()
        return struct.pack("<Q", len(h)) + h + data
    put("fuzz_safetensors", "f16_bf16.bin",
        st('{"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},'
           '"b":{"dtype":"BF16","shape":[1,1],"data_offsets":[4,6]}}  ', bytes(6)))
    put("fuzz_safetensors", "header_len_huge.bin", struct.pack("<Q", 1 << 62) + b"{}")
    put("fuzz_safetensors", "overlap.bin",
        st('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
           '"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}', bytes(8)))
    put("fuzz_safetensors", "shape_overflow.bin",
        st('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}}', bytes(4)))
    put("fuzz_safetensors", "bad_json.bin", st('{"a":{"dtype":"F32",', bytes(4)))
    put("fuzz_safetensors", "i32.bin", st('{"a":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', bytes(4)))


def report_seeds():
    # metrics.jsonl, NUL, summary.json, NUL, config.yaml (fuzz/fuzz_report.cpp).
    steps = "".join('{"kind":"step","epoch":1,"step":%d,"loss":%g,"accuracy":0.%d,"learning_rate":0.001,'
                    '"loss_scale":1,"skipped_steps":%d,"images_per_sec":100}\n' % (i, 2.0 / i, i, i // 3)
                    for i in range(1, 9))
    epoch = ('{"kind":"epoch","epoch":1,"step":8,"train_loss":0.5,"test_loss":0.6,"test_accuracy":0.9,'
             '"learning_rate":0.001}\n')
    summary = ('{"status":"completed","exit_code":0,"epochs":1,"steps":8,"final_test_accuracy":0.9,'
               '"policy":"float32","device":"cpu","memory":{"activation_bytes":1000}}')
    config = "name: r\nseed: 1\ndata: {dataset: synthetic, batch_size: 8}\noptimizer: {learning_rate: 0.001}\n"
    put("fuzz_report", "run.bin", steps + epoch + "\0" + summary + "\0" + config)
    put("fuzz_report", "metrics_only.bin", steps + '{"kind":"step","step":9,"lo')
    put("fuzz_report", "bad_lines.bin", "not json\n[1,2]\n" + "[" * 200 + "\n" + '{"kind":7}\n' + steps)
    put("fuzz_report", "deep_summary.bin", steps + "\0" + "[" * 5000 + "\0" + "a: &a [1, *a]\n")


if __name__ == "__main__":
    config_seeds()
    idx_seeds()
    cifar_seeds()
    checkpoint_seeds()
    safetensors_seeds()
    report_seeds()
