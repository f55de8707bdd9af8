#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Reads the TensorBoard event files of an mpx run with TensorBoard's own Python
# reader (EventAccumulator, which checks each record's CRC) and prints every tag
# with its number of points, first and last step and last value; then compares
# each scalar with the run's metrics.jsonl (docs/report.md has the tag table).
# A cross-check anyone can run, not a dependency of mpx:
#   python3 -m venv ~/.cache/mpx-tb-venv && ~/.cache/mpx-tb-venv/bin/pip install tensorboard
#   ~/.cache/mpx-tb-venv/bin/python bench/tensorboard_peer.py runs/<run>
import argparse
import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

# tag -> (metrics.jsonl kind, field); the step of the epoch tags is the 0-based epoch.
TRAIN = {
    "batch_loss": ("step", "loss"), "batch_accuracy": ("step", "accuracy"),
    "batch_learning_rate": ("step", "learning_rate"), "batch_loss_scale": ("step", "loss_scale"),
    "batch_skipped_steps": ("step", "skipped_steps"), "batch_images_per_sec": ("step", "images_per_sec"),
    "batch_memory_bytes": ("step", "memory_bytes"),
    "epoch_loss": ("epoch", "train_loss"), "epoch_accuracy": ("epoch", "train_accuracy"),
    "epoch_learning_rate": ("epoch", "learning_rate"), "epoch_loss_scale": ("epoch", "loss_scale"),
    "epoch_skipped_steps": ("epoch", "skipped_steps"), "epoch_images_per_sec": ("epoch", "images_per_sec"),
}
VALIDATION = {
    "epoch_loss": ("epoch", "test_loss"), "epoch_accuracy": ("epoch", "test_accuracy"),
    "evaluation_loss_vs_iterations": ("eval", "test_loss"),
    "evaluation_accuracy_vs_iterations": ("eval", "test_accuracy"),
}


def f32(x):
    return float("nan") if x is None else struct.unpack("f", struct.pack("f", x))[0]


def expected(records, kind, field):
    out = []
    for r in records:
        if kind == "step" and r["kind"] == "step":
            out.append((r["step"], f32(r[field])))
        elif kind == "epoch" and r["kind"] == "epoch" and (field.startswith("train") or field in (
                "learning_rate", "loss_scale", "skipped_steps", "images_per_sec") or r["test_accuracy"] is not None):
            out.append((r["epoch"] - 1, f32(r[field])))
        elif kind == "eval" and r["kind"] == "epoch" and r["test_accuracy"] is not None:
            out.append((r["step"], f32(r[field])))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    args = ap.parse_args()
    with open(os.path.join(args.run_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    bad = 0
    for sub, table in (("train", TRAIN), ("validation", VALIDATION)):
        acc = EventAccumulator(os.path.join(args.run_dir, "tensorboard", sub), size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        print(f"{sub}/: {len(tags)} scalar tags")
        for tag in tags:
            ev = acc.Scalars(tag)
            print(f"  {tag:36s} {len(ev):4d} points, steps {ev[0].step}..{ev[-1].step}, last {ev[-1].value:.6g}")
            if tag not in table:
                print(f"    not an mpx tag"); bad += 1; continue
            want = expected(records, *table[tag])
            got = [(e.step, e.value) for e in ev]
            same = len(got) == len(want) and all(
                s == ws and (v == wv or (math.isnan(v) and math.isnan(wv))) for (s, v), (ws, wv) in zip(got, want))
            if not same:
                print(f"    differs from metrics.jsonl: {len(got)} points, {len(want)} expected"); bad += 1
    print("every scalar equals metrics.jsonl" if bad == 0 else f"{bad} tag(s) differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
