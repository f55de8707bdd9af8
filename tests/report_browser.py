#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# `mpx report`'s page in a real headless browser (docs/report.md, docs/testing.md):
# two short runs, their report opened by Debian's chromium (headless shell), a
# screenshot checked for ink in every plot area, and the page's console checked
# for errors. Exit 77 (skipped) with the reason when no chromium is installed
# (scripts/install_browser.sh installs it).
import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

YAML = """name: browser
device: cpu
policy: mixed_float16
loss_scale: {mode: dynamic, initial: 1.6777216e+7, growth_interval: 4}
data: {dataset: synthetic, batch_size: 8, synthetic_train: 64, synthetic_test: 16}
model:
  layers:
    - {type: flatten}
    - {type: dense, units: 10, activation: softmax, dtype: float32}
train: {epochs: 3, log_every: 2}
"""

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def skip(why):
    print("SKIPPED: " + why)
    sys.exit(77)


def png_pixels(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB/RGBA non-interlaced PNG."""
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
            bpp = 3 if ctype == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = w * bpp
    rows, prev = [], bytearray(stride)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b, c = prev[i], prev[i - bpp] if i >= bpp else 0
            if f == 1: line[i] = (line[i] + a) & 255
            elif f == 2: line[i] = (line[i] + b) & 255
            elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(line)
        prev = line
    return w, h, bpp, rows


def run_browser(exe, url, out_dir, size, shot=None):
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1",
           "--enable-logging=stderr", "--v=0", "--window-size=%d,%d" % size, "--user-data-dir=" + out_dir + "/profile"]
    cmd += ["--screenshot=" + shot] if shot else ["--dump-dom"]
    p = subprocess.run(cmd + [url], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mpx", required=True)
    args = ap.parse_args()
    exe = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if not exe:
        skip("no chromium found (%s); scripts/install_browser.sh installs Debian's chromium-headless-shell"
             % ", ".join(BROWSERS))
    with tempfile.TemporaryDirectory(prefix="mpx_test_browser_") as d:
        open(os.path.join(d, "c.yaml"), "w").write(YAML)
        for name, lr in (("a", "1e-3"), ("b", "3e-3")):
            subprocess.run([args.mpx, "train", "--no-progress", "--config", "c.yaml", "--run-dir", name, "--set",
                            "optimizer.learning_rate=" + lr], cwd=d, check=True, capture_output=True)
        subprocess.run([args.mpx, "report", "a", "b", "--out", "r.html"], cwd=d, check=True, capture_output=True)
        url = "file://" + os.path.join(d, "r.html") + "#selftest"

        # First pass: the layout (the page's self-check prints the plot areas' boxes).
        rc, _, err = run_browser(exe, url, d, (1300, 900))
        assert rc == 0, err
        m = re.search(r"mpx-selftest (\{.*?\})\"", err)
        assert m, "the page's self-check line is not on the console:\n" + err
        layout = json.loads(m.group(1))
        # Chromium logs every console message at INFO; the page writes nothing but its self-check line,
        # so any other message (console.error, an uncaught exception) is a failure.
        errors = [l for l in err.splitlines() if ":CONSOLE" in l and "mpx-selftest" not in l]
        assert not errors, "console messages besides the self-check:\n" + "\n".join(errors)
        plots = layout["plots"]
        assert len(plots) == 6 * 3, "expected 18 plot areas (6 overlaid, 6 per run), got %d" % len(plots)

        # Second pass: one screenshot of the whole page; every plot area must hold coloured ink.
        height = layout["height"] + 20
        shot = os.path.join(d, "shot.png")
        rc, _, err = run_browser(exe, url, d, (1300, height), shot)
        assert rc == 0 and os.path.exists(shot), err
        w, h, bpp, rows = png_pixels(shot)
        for i, (x, y, pw, ph) in enumerate(plots):
            assert x + pw <= w and y + ph <= h, "plot %d at %s is outside the %dx%d screenshot" % (i, (x, y, pw, ph), w, h)
            ink = 0
            for yy in range(y + 2, y + ph - 2):
                line = rows[yy]
                for xx in range(x + 2, x + pw - 2):
                    r, g, b = line[xx * bpp], line[xx * bpp + 1], line[xx * bpp + 2]
                    if max(r, g, b) - min(r, g, b) > 60:  # a series colour, not the grey grid or the white
                        ink += 1
            assert ink >= 30, "plot %d at %s is blank (%d coloured pixels)" % (i, (x, y, pw, ph), ink)
            print("plot %2d at (%d,%d) %dx%d: %d coloured pixels" % (i, x, y, pw, ph, ink))
        print("OK: %d plot areas drawn, no console errors (%s, screenshot %dx%d)" % (len(plots), os.path.basename(exe), w, h))


if __name__ == "__main__":
    main()
