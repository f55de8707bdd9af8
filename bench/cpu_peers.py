#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""mpx against tf-keras and PyTorch on the CPU: the same nets, batch and threads, alternating.

For each seed net (configs/mnist_smoke.yaml, configs/mnist_seed.yaml: the seed
guides' Conv2D(32) -> Flatten -> Dense(10) at batch 256, configs/cifar10_fp32.yaml) and
policy it runs `mpx bench`, the Keras twin (bench/keras_peer.py) and the
PyTorch twin (bench/torch_peer.py), in rounds whose tool order rotates, and
prints the median images/s of each tool, mpx / best peer, the issue's targets,
the float32 GEMM ceiling measured in the same run (bench/gemm_ceiling, oneDNN
sgemm; numpy and torch matmul beside it) and the convolutions' achieved
GFLOP/s as a fraction of it, and the memory bandwidth measured in the same run
(bench/mem_bandwidth) beside each step's activation traffic. It checks first that each peer's net has the
parameters of mpx's (`mpx export`, name by name and shape by shape), and says
which CPU path ran (mpx bench's kernels; the peers' oneDNN verbose lines).

    bench/keras_setup.sh; bench/torch_setup.sh      # once: the peers' venvs
    bench/cpu_peers.py --data ../shared/data         # or --quick for a smoke check

By default it runs everything twice and prints one set of tables per CPU path:
the CPU as it is, then every tool capped at AVX2 (--isa-cap none or avx2 runs
one of them). A tf-keras run that fails is run again with oneDNN off (TF's
Eigen kernels; under the cap, every bfloat16 run) and marked `*`.

A benchmark, run by hand; never part of the tests. docs/cpu-performance.md,
"Against the peers", says what each figure means.
"""
import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import peers_probe as probe  # noqa: E402
except ImportError as e:  # pyyaml
    sys.exit(f"cpu_peers.py: {e}; install pyyaml, or run it with a peer's venv python "
             "(~/.cache/mpx-peers/keras/bin/python bench/cpu_peers.py)")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "mpx-peers")
# net -> (config, data sub-folder, (steps, warmup), (quick steps, quick warmup))
NETS = {"mnist_smoke": ("configs/mnist_smoke.yaml", "mnist", (100, 10), (10, 2)),
        "mnist_seed": ("configs/mnist_seed.yaml", "mnist", (40, 5), (5, 1)),
        "cifar10": ("configs/cifar10_fp32.yaml", "cifar10-subset", (15, 3), (3, 1))}
# peer -> (its script in bench/, the command that makes its venv)
PEERS = {"tf-keras": ("keras_peer.py", "bench/keras_setup.sh"), "pytorch": ("torch_peer.py", "bench/torch_setup.sh")}
# (net, policy) -> [(what mpx is compared with, the minimum ratio)]: every net in every policy at
# least twice the best peer in the same policy; mixed_bfloat16 against mpx's own float32 as well,
# at BF16_OVER_F32[True] where the CPU path has bfloat16 dot products (AVX512-BF16 or AMX-BF16,
# and the ISA not capped below them), else BF16_OVER_F32[False].
BF16_OVER_F32 = {True: 1.6, False: 1.0}


def targets_for(isa_cap):
    """The targets of one CPU path (--isa-cap none or avx2)."""
    from peers_probe import cpu_description
    bf16_dot = isa_cap == "none" and bool({"avx512_bf16", "amx_bf16"} & set(cpu_description()[1]))
    out = {}
    for net in NETS:
        for policy in ("float32", "mixed_bfloat16"):
            out[(net, policy)] = [("best peer", 2.0)]
        out[(net, "mixed_bfloat16")].append(("mpx float32", BF16_OVER_F32[bf16_dot]))
    return out


class Bench:
    def __init__(self, a):
        self.a = a
        self.root = ROOT
        self.env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), CUDA_VISIBLE_DEVICES="-1",
                        TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
        for k in ("ONEDNN_VERBOSE", "DNNL_VERBOSE", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
            self.env.pop(k, None)  # these change what runs; set them per call where wanted
        if a.omp_wait_policy == "mpx":  # what mpx gives itself: a short spin, then sleep
            self.env.pop("OMP_WAIT_POLICY", None)
            self.env["GOMP_SPINCOUNT"] = "1000"
        elif a.omp_wait_policy == "passive":  # sleep at once
            self.env.pop("GOMP_SPINCOUNT", None)
            self.env["OMP_WAIT_POLICY"] = "passive"
        elif a.omp_wait_policy == "unset":
            self.env.pop("OMP_WAIT_POLICY", None)
            self.env.pop("GOMP_SPINCOUNT", None)
        if a.isa_cap == "avx2":  # every tool as on a CPU without AVX-512 (docs/cpu-performance.md)
            self.env.update(ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2", MPX_CPU_POOL_ISA="avx2",
                            ATEN_CPU_CAPABILITY="avx2", OPENBLAS_CORETYPE="Haswell", MKL_ENABLE_INSTRUCTIONS="AVX2")
        self.python = {"tf-keras": a.keras_python, "pytorch": a.torch_python}

    def mpx_cmd(self, net, policy, steps, warmup):
        config, sub = NETS[net][0], NETS[net][1]
        cmd = [self.a.mpx, "bench", "--config", config, "--steps", str(steps), "--warmup", str(warmup), "--json",
               "--set", "device=cpu", "--set", f"policy={policy}"]
        if self.a.data and os.path.isdir(os.path.join(self.a.data, sub)):
            cmd += ["--set", f"data.path={os.path.join(self.a.data, sub)}"]
        return cmd

    def peer_cmd(self, peer, net, policy, steps, warmup):
        return [self.python[peer], os.path.join(ROOT, "bench", PEERS[peer][0]), "--config", NETS[net][0],
                "--policy", policy, "--steps", str(steps), "--warmup", str(warmup), "--threads",
                str(self.a.threads), "--budget-s", str(self.a.budget_s), "--json"]

    def fallback_env(self, tool):
        """(env, what it changes) for a second try of a `tool` run that failed, or None. tf-keras
        with oneDNN off runs TF's own (Eigen) kernels: under the AVX2 cap oneDNN has no bfloat16
        convolution, and TF stops the run instead of falling back itself; on a CPU without
        AVX-512 that is how a tf-keras user gets a mixed_bfloat16 step."""
        if tool != "tf-keras":
            return None
        return dict(self.env, TF_ENABLE_ONEDNN_OPTS="0"), "oneDNN off (TF_ENABLE_ONEDNN_OPTS=0: TF's Eigen kernels)"

    def cmd(self, tool, net, policy, steps, warmup):
        if tool == "mpx":
            return self.mpx_cmd(net, policy, steps, warmup)
        return self.peer_cmd(tool, net, policy, steps, warmup)

    def peer_available(self, peer):
        py = self.python[peer]
        mod = "tf_keras" if peer == "tf-keras" else "torch"
        if not os.path.exists(py):
            return False
        return subprocess.run([py, "-c", f"import {mod}"], capture_output=True, env=self.env).returncode == 0

    def gemm(self):
        """GEMM GFLOP/s on the same threads: oneDNN's sgemm (bench/gemm_ceiling), numpy's and
        torch's float32 matmul, torch's bfloat16 matmul. A list of {gemm, dtype, gflops | error}."""
        out = []

        def add(cmd, name, dtype):
            r, err, _ = probe.run_json(cmd, self.env, 300, ROOT)
            out.append({"gemm": r["gemm"] if r else name, "dtype": dtype, "gflops": r["gflops_best"] if r else None,
                        "error": err})

        add([self.a.gemm_ceiling, str(self.a.gemm_n)], "oneDNN sgemm", "float32")
        for peer, lib, dtype in (("tf-keras", "numpy", "float32"), ("pytorch", "torch", "float32"),
                                 ("pytorch", "torch", "bfloat16")):
            if peer in self.peers and dtype == "bfloat16" and self.a.isa_cap == "avx2":
                # Capped at AVX2 PyTorch has no bfloat16 dot products: its matmul ran past the
                # 300 s limit in every round, and the rows use the float32 ceiling anyway.
                out.append({"gemm": f"{lib} {dtype} matmul", "dtype": dtype, "gflops": None,
                            "error": "not measured under the AVX2 cap (no bfloat16 math: the float32 ceiling applies)"})
            elif peer in self.peers:
                add([self.python[peer], os.path.join(ROOT, "bench", "peers_gemm.py"), "--lib", lib, "--dtype", dtype,
                     "--n", str(self.a.gemm_n), "--threads", str(self.a.threads)], f"{lib} {dtype} matmul", dtype)
        return out

    def bandwidth(self):
        """The memory's read, write and copy GB/s on the same threads (bench/mem_bandwidth), or an
        {error} when it failed."""
        r, err, _ = probe.run_json([self.a.mem_bandwidth], self.env, 300, ROOT)
        return r if r else {"error": err}

    def check_params(self, net, available):
        """Each peer's parameter names and shapes against `mpx export` of the same config."""
        lines = []
        with tempfile.TemporaryDirectory() as tmp:
            shapes = {}
            for layout in ("keras", "pytorch"):
                path = os.path.join(tmp, f"{layout}.safetensors")
                cmd = [self.a.mpx, "export", "--config", NETS[net][0], "--layout", layout, "-o", path]
                p = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=ROOT, timeout=120)
                shapes[layout] = probe.safetensors_shapes(path) if p.returncode == 0 else None
                if p.returncode != 0:
                    lines.append(f"  mpx export --layout {layout} failed: {p.stderr.strip()[-200:]}")
        for peer in available:
            r, err, _ = probe.run_json(self.peer_cmd(peer, net, "float32", 1, 1), self.env, 300, ROOT)
            mine = shapes["keras" if peer == "tf-keras" else "pytorch"]
            if r is None or mine is None:
                lines.append(f"  {peer}: not checked ({err or 'no mpx export'})")
                continue
            count = sum(numel(s) for s in mine.values())
            diff = probe.compare_shapes(mine, r["param_shapes"])
            lines.append(f"  {peer}: {r['param_count']} parameters, mpx {count}: "
                         + ("every layer's tensors match by name and shape" if not diff else f"DIFFER: {diff}"))
        return lines

    def onednn_probe(self, peer, net, policy):
        """One step of the peer under ONEDNN_VERBOSE=1: its oneDNN version, ISA and kernels."""
        env = dict(self.env, ONEDNN_VERBOSE="1", DNNL_VERBOSE="1")
        try:
            p = subprocess.run(self.peer_cmd(peer, net, policy, 1, 1), capture_output=True, text=True, env=env,
                               cwd=ROOT, timeout=self.a.timeout)
        except subprocess.TimeoutExpired:
            return None
        return probe.onednn_summary(p.stdout + p.stderr)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="docs/cpu-performance.md, 'Against the peers'")
    ap.add_argument("--quick", action="store_true", help="1 round, a few steps: a smoke check of the script")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS, TF intra-op, torch.set_num_threads")
    ap.add_argument("--nets", default=",".join(NETS))
    ap.add_argument("--policies", default="float32,mixed_bfloat16",
                    help="add mixed_float16 with care: both peers take minutes per CIFAR step on the CPU")
    ap.add_argument("--data", default=os.environ.get("MPX_DATA_MIRROR", ""),
                    help="folder with mnist/ and cifar10-subset/ (default $MPX_DATA_MIRROR; else random inputs)")
    ap.add_argument("--mpx", default=os.path.join(ROOT, "build", "app", "mpx"))
    ap.add_argument("--gemm-ceiling", default=os.path.join(ROOT, "build", "bench", "gemm_ceiling"))
    ap.add_argument("--gemm-n", type=int, default=2048)
    ap.add_argument("--mem-bandwidth", default=os.path.join(ROOT, "build", "bench", "mem_bandwidth"))
    ap.add_argument("--keras-python", default=os.path.join(CACHE, "keras", "bin", "python"))
    ap.add_argument("--torch-python", default=os.path.join(CACHE, "torch", "bin", "python"))
    ap.add_argument("--omp-wait-policy", choices=["mpx", "passive", "unset", "inherit"], default="mpx",
                    help="libgomp's waits for every tool: mpx (GOMP_SPINCOUNT=1000, mpx's own default), passive "
                         "(OMP_WAIT_POLICY=passive), unset (each tool's own default; PyTorch's threads then spin "
                         "long), inherit (as in this shell)")
    ap.add_argument("--isa-cap", choices=["both", "none", "avx2"], default="both",
                    help="both (the default): one set of tables per CPU path, the CPU as it is and then capped at "
                         "AVX2; none: the CPU as it is only; avx2: cap every tool at AVX2 (oneDNN's ONEDNN_MAX_CPU_ISA, mpx's pooling, PyTorch's "
                         "ATEN_CPU_CAPABILITY and MKL_ENABLE_INSTRUCTIONS, numpy's OPENBLAS_CORETYPE), to measure "
                         "an AVX2-only CPU's code paths on a newer one")
    ap.add_argument("--budget-s", type=float, default=30,
                    help="a peer stops timing after this many seconds of timed steps (slow 16-bit paths)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds one run may take")
    ap.add_argument("--no-probe", action="store_true", help="skip the oneDNN verbose runs of the peers")
    ap.add_argument("--json", help="also write every run's figures to this file")
    a = ap.parse_args()
    if a.quick:
        a.rounds = 1
    for k in ("mpx", "gemm_ceiling", "mem_bandwidth", "data", "keras_python", "torch_python", "json"):
        if getattr(a, k):
            setattr(a, k, os.path.abspath(getattr(a, k)))  # the tools run in the repository root
    for exe in (a.mpx, a.gemm_ceiling, a.mem_bandwidth):
        if not os.access(exe, os.X_OK):
            sys.exit(f"{exe}: not built (scripts/build.sh builds mpx, build/bench/gemm_ceiling and "
                     "build/bench/mem_bandwidth)")
    from cpu_peers_report import run_all
    if a.isa_cap != "both":
        return run_all(Bench(a), a, NETS, PEERS, targets_for(a.isa_cap))
    rc = 0
    for cap, title in (("none", "the CPU as it is"), ("avx2", "capped at AVX2")):
        one = argparse.Namespace(**vars(a))
        one.isa_cap = cap
        if a.json:
            root, ext = os.path.splitext(a.json)
            one.json = f"{root}.{cap}{ext or '.json'}"
        print(f"\n## CPU path: {title} (--isa-cap {cap})\n")
        rc = run_all(Bench(one), one, NETS, PEERS, targets_for(cap)) or rc
    return rc


if __name__ == "__main__":
    sys.exit(main())
