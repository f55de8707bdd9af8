# SPDX-License-Identifier: MIT
"""What the peers of `mpx bench` share (bench/keras_peer.py, bench/torch_peer.py): the input
shape of a config, the step-time figures as `mpx bench --json` names them, and the command
line. Standard library only: each peer imports it from its own venv."""
import argparse
import json
import statistics

INPUT_HWC = {"mnist": (28, 28, 1), "fashion_mnist": (28, 28, 1), "cifar10": (32, 32, 3)}


def input_shape(cfg):
    """The config's model.input_shape, else its dataset's, as (H, W, C)."""
    shape = cfg["model"].get("input_shape") or INPUT_HWC.get(cfg["data"]["dataset"])
    if shape is None:
        raise SystemExit(f"{cfg.get('name')}: no model.input_shape and no default for {cfg['data']['dataset']}")
    return tuple(int(v) for v in shape)


def step_figures(batch, ms):
    """images/s (images over the summed step times, as `mpx bench`) and the step times' spread."""
    return {"steps": len(ms), "images_per_sec": batch * len(ms) / (sum(ms) / 1e3),
            "step_ms_median": statistics.median(ms), "step_ms_min": min(ms), "step_ms_max": max(ms)}


def main(doc, run, min_warmup):
    """Parses a peer's command line, runs run(args) and prints its result (JSON with --json)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--config", required=True, help="mpx YAML config (the net, batch, optimizer, policy)")
    ap.add_argument("--policy", choices=["float32", "mixed_float16", "mixed_bfloat16"], help="overrides the config's")
    ap.add_argument("--batch", type=int, default=0, help="overrides data.batch_size")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help=f"untimed steps first (at least {min_warmup})")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=0,
                    help="stop timing after this many seconds of timed steps (at least 2 steps; 0: no limit)")
    ap.add_argument("--json", action="store_true", help="one JSON object on the last line of stdout")
    a = ap.parse_args()
    if a.steps < 1 or a.warmup < min_warmup:
        ap.error(f"--steps must be at least 1 and --warmup at least {min_warmup}")
    r = run(a)
    if a.json:
        print(json.dumps(r))
    else:
        print(f"{r['version']} {r['policy']} batch {r['batch_size']} threads {r['threads']}: "
              f"{r['images_per_sec']:.1f} images/s (step median {r['step_ms_median']:.1f} ms), "
              f"{r['param_count']} parameters")
