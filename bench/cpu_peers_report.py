# SPDX-License-Identifier: MIT
"""The rounds and the tables of bench/cpu_peers.py (docs/cpu-performance.md, "Against the peers")."""
import json
import os
import statistics
import subprocess
import sys
import time

import peers_probe as probe

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")


def uptime():
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "load average %.2f, %.2f, %.2f" % os.getloadavg()


def run_one(b, a, key, cmd, fallbacks):
    """One run of `cmd`: (its JSON or None, the error). Where the tool failed (not by the time
    limit) and has a second way to run (b.fallback_env), that runs at once, and in later rounds
    first; `fallbacks`
    records {key: (what changed, the first way's error)}, and the run's JSON says it too."""
    alt = b.fallback_env(key[2])
    if key in fallbacks and alt:
        res, err, _ = probe.run_json(cmd, alt[0], a.timeout, b.root)
    else:
        res, err, _ = probe.run_json(cmd, b.env, a.timeout, b.root)
        if res is None and alt and not err.startswith("timed out"):  # a slow run would be slow again
            first = err
            res, err, _ = probe.run_json(cmd, alt[0], a.timeout, b.root)
            if res is not None:
                fallbacks[key] = (alt[1], first)
                print(f"  {' '.join(key)}: failed ({first.splitlines()[0][:160]}); ran again with {alt[1]}",
                      file=sys.stderr)
            else:
                err = f"{first}; again with {alt[1]}: {err}"
    if res is not None and key in fallbacks:
        res["fallback"] = fallbacks[key][0]
    return res, err


def run_rounds(b, a, nets, policies, tools, net_table):
    """Every (net, policy, tool) once per round, the tools' order rotated each round;
    the GEMM ceiling measured at the start of every round."""
    runs, errors, gemm, memory = {}, {}, [], []
    b.fallbacks = {}
    for r in range(a.rounds):
        g = b.gemm()
        gemm.append(g)
        print(f"round {r + 1}: GEMM " + ", ".join(f"{x['gemm']} {x['gflops']:.0f}" if x["gflops"] else
                                                 f"{x['gemm']} {x['error']}" for x in g) + " GFLOP/s", file=sys.stderr)
        m = b.bandwidth()
        memory.append(m)
        print(f"round {r + 1}: memory " + (f"read {m['read_gbs_best']:.1f}, write {m['write_gbs_best']:.1f}, copy "
                                          f"{m['copy_gbs_best']:.1f} GB/s" if "error" not in m else m["error"]),
              file=sys.stderr)
        for net in nets:
            steps, warmup = net_table[net][3 if a.quick else 2]
            for policy in policies:
                k = r % len(tools)
                for tool in tools[k:] + tools[:k]:
                    key = (net, policy, tool)
                    res, err = run_one(b, a, key, b.cmd(tool, net, policy, steps, warmup), b.fallbacks)
                    if res is None:
                        errors[key] = err
                        print(f"round {r + 1}: {net} {policy} {tool}: FAILED {err}", file=sys.stderr)
                        continue
                    runs.setdefault(key, []).append(res)
                    print(f"round {r + 1}: {net} {policy} {tool}: {res['images_per_sec']:.1f} images/s",
                          file=sys.stderr)
    return runs, errors, gemm, memory


def ceiling(gemm):
    """{gemm name: [best GFLOP/s of each round]} and {dtype: the best of all} over the rounds."""
    per, best = {}, {}
    for g in gemm:
        for x in g:
            if x["gflops"]:
                per.setdefault(x["gemm"], []).append(x["gflops"])
                best[x["dtype"]] = max(best.get(x["dtype"], 0.0), x["gflops"])
    return per, best


def fmt_rate(values):
    if not values:
        return "-"
    med = statistics.median(values)
    return f"{med:,.0f}" + (f" ({min(values):,.0f}-{max(values):,.0f})" if len(values) > 1 else "")


def rates(runs, key):
    return [r["images_per_sec"] for r in runs.get(key, [])]


def print_speed(runs, errors, fallbacks, nets, policies, tools, targets):
    peers = [t for t in tools if t != "mpx"]
    print("\n## images/s: median of the rounds (min-max)\n")
    print("| net | policy | batch | " + " | ".join(tools) + " | mpx / best peer | target | met |")
    print("|" + " --- |" * (len(tools) + 6))
    verdicts = []
    for net in nets:
        for policy in policies:
            med = {t: statistics.median(rates(runs, (net, policy, t))) for t in tools if rates(runs, (net, policy, t))}
            batch = next((r["batch_size"] for t in tools for r in runs.get((net, policy, t), [])), "-")
            cells = [(fmt_rate(rates(runs, (net, policy, t))) + (" *" if (net, policy, t) in fallbacks else ""))
                     if (net, policy, t) not in errors or rates(runs, (net, policy, t)) else "failed" for t in tools]
            best = max(((med[p], p) for p in peers if p in med), default=None)
            ratio = f"{med['mpx'] / best[0]:.2f}x ({best[1]})" if best and "mpx" in med else "-"
            shown = []
            for what, need in targets.get((net, policy), []):
                if what == "best peer":
                    base = best[0] if best else None
                else:  # mpx's own float32 on the same net
                    f32 = rates(runs, (net, "float32", "mpx"))
                    base = statistics.median(f32) if f32 else None
                target = f">= {need}x {what}"
                met = "-"
                if base and "mpx" in med:
                    got = med["mpx"] / base
                    met = f"{'yes' if got >= need else 'no'} ({got:.2f}x)"
                    verdicts.append((net, policy, target, got >= need, got))
                shown.append((target, met))
            target = "; ".join(t for t, _ in shown) or "-"
            met = "; ".join(m for _, m in shown) or "-"
            print(f"| {net} | {policy} | {batch} | " + " | ".join(cells) + f" | {ratio} | {target} | {met} |")
    for t in peers:
        v = next((x["version"] for k, rs in runs.items() if k[2] == t for x in rs), None)
        if v:
            print(f"- {t}: {v}")
    for key, (what, err) in sorted(fallbacks.items()):
        print(f"- * {' '.join(key)}: {what}; with its default kernels it failed: {err.splitlines()[0][:300]}")
    for key, err in sorted(errors.items()):
        print(f"- {' '.join(key)}: {err}")
    return verdicts


def print_conv(runs, nets, policies, tools, config_of, gemm):
    per, best = ceiling(gemm)
    print("\n## GEMM ceiling, measured at the start of every round (GFLOP/s, best of each round)\n")
    for k, v in per.items():
        print(f"- {k}: " + ", ".join(f"{x:.0f}" for x in v))
    for g in gemm[-1:]:
        for x in g:
            if x["error"]:
                print(f"- {x['gemm']}: {x['error']}")
    if "float32" not in best:
        print("- no float32 GEMM figure: the ceiling is unknown")
        return
    print(f"- ceiling: float32 {best['float32']:.0f} GFLOP/s"
          + (f", bfloat16 {best['bfloat16']:.0f} GFLOP/s" if "bfloat16" in best else ""))
    print("\n## Convolutions: GFLOP/s achieved over the whole step (conv FLOPs per image x images/s), "
          "% of the ceiling\n")
    print("| net | policy | conv MFLOP/image (fwd + bwd) | ceiling | " + " | ".join(tools) + " |")
    print("|" + " --- |" * (len(tools) + 4))
    for net in nets:
        fl = probe.conv_flops(config_of(net))
        if fl is None:
            continue
        per_img = fl[0] + fl[1]
        for policy in policies:
            # bfloat16 math is only faster where the CPU has it natively; elsewhere (an AVX2
            # CPU, or the --isa-cap stand-in for one) 16-bit runs on float32 math.
            dtype = "bfloat16" if policy == "mixed_bfloat16" and best.get("bfloat16", 0.0) > best["float32"] else "float32"
            cells = []
            for t in tools:
                r = rates(runs, (net, policy, t))
                g = per_img * statistics.median(r) / 1e9 if r else None
                cells.append(f"{g:.1f} ({100 * g / best[dtype]:.0f}%)" if g else "-")
            print(f"| {net} | {policy} | {fl[0] / 1e6:.1f} + {fl[1] / 1e6:.1f} | {dtype} {best[dtype]:.0f} | "
                  + " | ".join(cells) + " |")
    print("\nFLOPs: 2 x multiply-adds of every convolution forward, its weight gradient, and its data "
          "gradient except for the first layer (its input needs none). The step's other work "
          "(dense, pooling, optimizer, casts) counts as time but not as FLOPs, so these are lower "
          "bounds of the convolution kernels' own rate. mixed_bfloat16 rows are against the bfloat16 "
          "GEMM (PyTorch's) where it was measured faster than the float32 one (native bfloat16 "
          "math), else, as mixed_float16 rows, against the float32 one.")


# Passes over the activations that a training step cannot avoid once they outgrow the caches:
# each is written by the forward pass and read by the backward one, and its gradient is
# written and read once (docs/cpu-performance.md, "Against the peers").
ACTIVATION_PASSES = 4


def print_memory(runs, nets, policies, memory):
    """mpx's planned activations per step (mpx bench's activation_bytes) at ACTIVATION_PASSES
    passes, against the copy bandwidth measured in the same run: the time that traffic takes
    at best, and its share of mpx's median step."""
    copies = [m["copy_gbs_best"] for m in memory if "error" not in m]
    print("\n## Memory traffic: the activations against the bandwidth measured at the start of every round\n")
    for i, m in enumerate(memory):
        if "error" in m:
            print(f"- round {i + 1}: {m['error']}")
        else:
            print(f"- round {i + 1}: read {m['read_gbs_best']:.1f}, write {m['write_gbs_best']:.1f}, copy (read + "
                  f"write) {m['copy_gbs_best']:.1f} GB/s over {m['mib']} MiB arrays, {m['threads']} threads")
    if not copies:
        print("- no bandwidth figure: the table needs one")
        return
    bw = max(copies)
    print(f"\nThe step's activation traffic at {ACTIVATION_PASSES} passes over mpx's planned activations "
          f"(each written forward, read backward, its gradient written and read), at the best copy bandwidth "
          f"{bw:.1f} GB/s: a lower bound of its memory time where the activations outgrow the caches.\n")
    print("| net | policy | batch | activations MiB | traffic MB per step | at the bandwidth, ms | mpx step, ms "
          "(batch / images/s, median of the rounds) | share of the step |")
    print("|" + " --- |" * 8)
    for net in nets:
        for policy in policies:
            rs = runs.get((net, policy, "mpx"), [])
            if not rs or not rs[0].get("activation_bytes"):
                continue
            act = rs[0]["activation_bytes"]
            traffic = ACTIVATION_PASSES * act
            at_bw = traffic / (bw * 1e9) * 1e3
            step = statistics.median(r["batch_size"] / r["images_per_sec"] * 1e3 for r in rs)
            print(f"| {net} | {policy} | {rs[0]['batch_size']} | {act / 2**20:.1f} | {traffic / 1e6:.0f} | "
                  f"{at_bw:.2f} | {step:.2f} | {at_bw / step:.0%} |")


def print_paths(runs, probes, fallbacks, nets, policies, tools):
    model, flags = probe.cpu_description()
    print(f"\n## CPU path\n\n- CPU: {model}; flags: {' '.join(flags) or 'none of ' + ', '.join(probe.FLAGS_OF_INTEREST)}")
    for net in nets:
        for policy in policies:
            r = runs.get((net, policy, "mpx"))
            if r:
                ks = sorted({f"{k['op'].split(' for ')[0]} {k['impl']}" for k in r[0].get("kernels", [])})
                pieces = r[0].get("pieces", [])  # docs/cpu-performance.md, "Pieces of the batch"
                print(f"- mpx {net} {policy}: {r[0].get('library', '?')}; kernels: " + "; ".join(ks) +
                      ("; forward " + "; ".join(pieces) if pieces else ""))
            for t in tools:
                if t == "mpx":
                    continue
                p = probes.get((net, policy, t))
                extra = ""
                rr = runs.get((net, policy, t))
                if rr and rr[0].get("cpu_capability"):
                    extra = f"; ATen CPU capability {rr[0]['cpu_capability']}"
                if (net, policy, t) in fallbacks:
                    print(f"- {t} {net} {policy}: {fallbacks[(net, policy, t)][0]}: no oneDNN kernels")
                elif p:
                    ks = "; ".join(p["kernels"]) or "no oneDNN convolution/inner product/matmul executed"
                    print(f"- {t} {net} {policy}: {p['version'] or 'oneDNN version not printed'}; "
                          f"ISA {p['isa'] or '?'}{extra}; oneDNN kernels: {ks}")


def print_header(b, a, nets, net_table, peers_table):
    """The load, the settings, the peers found, and each peer's net checked against mpx's."""
    start = uptime()
    print(f"# mpx vs peers on the CPU, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}\n")
    print(f"- before: {start}")
    steps = [net_table[n][3 if a.quick else 2] for n in nets]
    waits = f"OMP_WAIT_POLICY {b.env.get('OMP_WAIT_POLICY', 'unset')}, GOMP_SPINCOUNT {b.env.get('GOMP_SPINCOUNT', 'unset')}"
    print(f"- threads {a.threads}, {waits}, ISA cap {a.isa_cap}, rounds {a.rounds}, "
          + ", ".join(f"{n} {s} steps after {w} warm-up" for n, (s, w) in zip(nets, steps)))
    b.peers = []
    for peer, (_, setup) in peers_table.items():
        if b.peer_available(peer):
            b.peers.append(peer)
        else:
            print(f"- {peer}: not installed ({b.python[peer]} cannot import it; run {setup})")
    print("\n## Same nets\n")
    for net in nets:
        print(f"- {net} ({net_table[net][0]}):")
        for line in b.check_params(net, b.peers):
            print(line)
    return start


def run_all(b, a, net_table, peers_table, targets):
    nets, policies = a.nets.split(","), a.policies.split(",")
    for n in nets:
        if n not in net_table:
            sys.exit(f"--nets: {n} is not one of {', '.join(net_table)}")
    for p in policies:
        if p not in POLICIES:
            sys.exit(f"--policies: {p} is not one of {', '.join(POLICIES)}")
    start = print_header(b, a, nets, net_table, peers_table)
    tools = ["mpx"] + b.peers
    runs, errors, gemm, memory = run_rounds(b, a, nets, policies, tools, net_table)
    probes = {}
    if not a.no_probe:
        for net in nets:
            for policy in policies:
                for peer in b.peers:
                    if (net, policy, peer) not in b.fallbacks:  # those ran without oneDNN
                        probes[(net, policy, peer)] = b.onednn_probe(peer, net, policy)
    verdicts = print_speed(runs, errors, b.fallbacks, nets, policies, tools, targets)
    print_conv(runs, nets, policies, tools, lambda n: os.path.join(b.root, net_table[n][0]), gemm)
    print_memory(runs, nets, policies, memory)
    print_paths(runs, probes, b.fallbacks, nets, policies, tools)
    end = uptime()
    print(f"\n- after: {end}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"uptime_before": start, "uptime_after": end, "threads": a.threads, "rounds": a.rounds,
                       "gemm": gemm, "memory": memory, "runs": {" ".join(k): v for k, v in runs.items()},
                       "errors": {" ".join(k): v for k, v in errors.items()},
                       "fallbacks": {" ".join(k): {"ran_with": w, "failed_with_default": e}
                                     for k, (w, e) in b.fallbacks.items()},
                       "probes": {" ".join(k): v for k, v in probes.items()},
                       "targets": [{"net": n, "policy": p, "target": t, "met": m, "ratio": g}
                                   for n, p, t, m, g in verdicts]}, f, indent=1)
    return 0
