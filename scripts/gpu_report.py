#!/usr/bin/env python3
"""The report of scripts/gpu_check.sh (docs/GPU_CHECK.md), standard library only.

  gpu_report.py report --part P --dry-run 0|1 --logs DIR --md FILE --json FILE
      reads DIR/steps.tsv (name, status, rc, seconds, limit, note per step) and the figures the
      steps left in DIR/facts, and writes the markdown and JSON reports.
  gpu_report.py compare-smi FIELDS EMBER_CSV NVIDIA_CSV [DEVICES_JSON]
      `ember smi --query-gpu` against `nvidia-smi --query-gpu` (same fields, csv,noheader,
      nounits) and `ember devices --json` against nvidia-smi; prints one line per field and
      exits 1 when a field that cannot change between the two reads differs.
"""
import argparse
import datetime
import json
import os
import re
import sys

# H200 SXM, NVIDIA's datasheet (the dense figures: half of the "with sparsity" ones it lists).
SPEC = {
    "source": "spec: NVIDIA H200 SXM datasheet (tensor-core figures dense, i.e. half the sparsity figures)",
    "hbm_GBps": 4800.0,
    "pcie_GBps_per_direction": 64.0,  # PCIe 5.0 x16
    "matmul_TFLOPs": {"bf16": 989.5, "f16": 989.5, "tf32": 494.7, "f32": 67.0, "f64": 67.0},
    "notes": {"f32": "FP32 without tensor cores (CUDA cores)", "f64": "FP64 tensor cores",
              "tf32": "f32 matmul with EMBER_CUDA_ALLOW_TF32=1 (TF32 tensor cores)"},
}
# The H100 SXM (80 GB HBM3), which the device tool may lend instead: its datasheet's figures
SPEC_H100 = {
    "source": "spec: NVIDIA H100 SXM datasheet (tensor-core figures dense, i.e. half the sparsity figures)",
    "hbm_GBps": 3350.0,
    "pcie_GBps_per_direction": 64.0,
    "matmul_TFLOPs": {"bf16": 989.5, "f16": 989.5, "tf32": 494.7, "f32": 67.0, "f64": 67.0},
    "notes": SPEC["notes"],
}


def pick_spec(mc):
    """The datasheet of the GPU nvidia-smi named (the H200's when none or another)."""
    names = " ".join(str(g.get("name", "")) for g in mc.get("gpus", []))
    return SPEC_H100 if "H100" in names else SPEC


# Fields that the two tools read at different instants: compared with a tolerance, never failed
VARYING = {"utilization.gpu", "utilization.memory", "temperature.gpu", "power.draw"}


def num(s):
    try:
        return float(s)
    except (TypeError, ValueError):
        return None


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    text = read(path)
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


# ---- ember smi / devices against nvidia-smi ----

def csv_rows(text):
    return [[c.strip() for c in line.split(",")] for line in (text or "").splitlines() if line.strip()]


def compare_field(field, e, n, total_mib):
    """(verdict, detail): verdict is match, differs (allowed) or MISMATCH."""
    if e == n:
        return "match", ""
    ev, nv = num(e), num(n)
    if field in ("memory.used", "memory.free") and ev is not None and nv is not None:
        tol = max(512.0, 0.01 * (total_mib or 0))
        return ("differs (allowed)" if abs(ev - nv) <= tol else "MISMATCH"), f"tolerance {tol:.0f} MiB"
    if field in VARYING:
        return "differs (allowed)", "sampled at different instants"
    if field == "power.limit" and ev is not None and nv is not None and abs(ev - nv) <= 0.5:
        return "match", "rounding"
    return "MISMATCH", ""


def compare_smi(fields, ember_csv, nvidia_csv, devices_json=None):
    fields = fields.split(",")
    er, nr = csv_rows(read(ember_csv)), csv_rows(read(nvidia_csv))
    rows, bad = [], 0
    if len(er) != len(nr):
        rows.append(("rows", str(len(er)), str(len(nr)), "MISMATCH", "one row per GPU"))
        bad += 1
    for i, (e, n) in enumerate(zip(er, nr)):
        if len(e) != len(fields) or len(n) != len(fields):
            rows.append((f"gpu {i}", ",".join(e), ",".join(n), "MISMATCH", f"expected {len(fields)} fields"))
            bad += 1
            continue
        total = num(n[fields.index("memory.total")]) if "memory.total" in fields else None
        for f, ev, nv in zip(fields, e, n):
            verdict, detail = compare_field(f, ev, nv, total)
            bad += verdict == "MISMATCH"
            rows.append((f"gpu {i} {f}", ev, nv, verdict, detail))
    dev = read_json(devices_json) if devices_json else None
    if dev is not None:
        cuda = next((t for t in dev.get("types", []) if t.get("type") == "cuda"), None)
        gpus = (cuda or {}).get("devices", [])
        for i, n in enumerate(nr):
            if i >= len(gpus) or len(n) != len(fields):
                rows.append((f"devices cuda:{i}", "absent", ",".join(n), "MISMATCH", "ember devices lists fewer GPUs"))
                bad += 1
                continue
            g = gpus[i]
            pairs = [("name", str(g.get("name")), n[fields.index("name")], "")]
            if "compute_cap" in fields and g.get("compute_capability") is not None:
                cc = g["compute_capability"]  # "9.0", as `ember devices --json` writes it
                if isinstance(cc, int):
                    cc = f"{cc // 10}.{cc % 10}"
                pairs.append(("compute_cap", str(cc), n[fields.index("compute_cap")], ""))
            if "memory.total" in fields and g.get("total_memory"):
                mib = g["total_memory"] / 1048576
                nv = num(n[fields.index("memory.total")]) or 0
                ok = abs(mib - nv) <= max(1.0, 0.02 * nv)
                pairs.append(("memory.total", f"{mib:.0f}", n[fields.index("memory.total")],
                              "cuDeviceTotalMem vs NVML, within 2%" if ok else "MISMATCH"))
            for f, ev, nv, detail in pairs:
                if detail:
                    verdict = "MISMATCH" if detail == "MISMATCH" else "match"
                else:
                    verdict = "match" if ev == nv else "MISMATCH"
                bad += verdict == "MISMATCH"
                rows.append((f"devices cuda:{i} {f}", ev, nv, verdict, "" if detail == "MISMATCH" else detail))
    print(f"{'field':32} {'ember':28} {'nvidia-smi':28} verdict")
    for name, ev, nv, verdict, detail in rows:
        print(f"{name:32} {ev:28} {nv:28} {verdict}{'  (' + detail + ')' if detail else ''}")
    print(f"smi comparison: {len(rows) - bad} of {len(rows)} fields agree" + (f", {bad} MISMATCH" if bad else ""))
    return 1 if bad or not rows else 0


# ---- figures ----

def frac(x, of):
    return round(x / of, 4) if x is not None and of else None


def pct(f):
    return "-" if f is None else f"{100 * f:.1f}%"


def fmt(x, digits=1):
    return "-" if x is None else f"{x:.{digits}f}"


def matmul_rows(bench, torch_rf, tf32=False):
    rows = []
    for r in ((bench or {}).get("matmul") or {}).get("results", []):
        dt = "tf32" if tf32 and r.get("dtype") == "f32" else r.get("dtype")
        tf = r.get("tflops")
        peak = SPEC["matmul_TFLOPs"].get(dt)
        measured = ((torch_rf or {}).get("matmul_TFLOPs") or {}).get(dt)
        rows.append({"dtype": dt, "n": r.get("n"), "tflops": tf, "error": r.get("error"),
                     "spec_tflops": peak, "fraction_of_spec": frac(tf, peak),
                     "torch_tflops": measured, "fraction_of_torch": frac(tf, measured)})
    return rows


def copy_rows(bench):
    copy = (bench or {}).get("copy") or {}
    rows = []
    for r in copy.get("results", []):
        for kind in ("h2d_pageable", "h2d_pinned", "d2h_pageable", "d2h_pinned"):
            gb = (r.get(kind) or {}).get("gb_per_s")
            rows.append({"bytes": r.get("bytes"), "kind": kind, "GBps": gb,
                         "fraction_of_pcie_spec": frac(gb, SPEC["pcie_GBps_per_direction"])})
    return rows


TRAIN_RUNS = ("ember_cuda", "torch_cuda", "ember_cpu", "ember_cuda_amp_bf16", "ember_cuda_amp_f16", "ember_cuda_cnn",
              "torch_cuda_cnn")


def parse_ember_train(text):
    """Epoch lines of `ember train`: seconds (the printed figure), accuracy."""
    eps = []
    for m in re.finditer(r"^epoch (\d+)/(\d+): train loss ([\d.naif]+), test accuracy ([\d.]+)%.*?"
                         r"([\d.]+) samples/s \(([\d.]+) s\)", text or "", re.M):
        eps.append({"epoch": int(m.group(1)), "loss": num(m.group(3)), "accuracy": num(m.group(4)),
                    "samples_per_s": num(m.group(5)), "seconds": num(m.group(6))})
    if not eps:
        return None
    secs = [e["seconds"] for e in eps]
    return {"epochs": len(eps), "s_per_epoch": sum(secs) / len(secs), "best_s_per_epoch": min(secs),
            "s_per_epoch_after_first": (sum(secs[1:]) / len(secs[1:])) if len(secs) > 1 else None,
            "accuracy": eps[-1]["accuracy"], "per_epoch": eps}


def parse_torch_train(text):
    m = re.search(r"^result (.*)$", text or "", re.M)
    if not m:
        return None
    kv = dict(p.split("=", 1) for p in m.group(1).split() if "=" in p)
    epochs = [num(x) for x in re.findall(r"^epoch \d+/\d+: .*\(([\d.]+) s\)$", text, re.M)]
    return {"epochs": int(kv.get("epochs", 0)), "s_per_epoch": num(kv.get("s_per_epoch")),
            "best_s_per_epoch": num(kv.get("best_s_per_epoch")),
            "s_per_epoch_after_first": (sum(epochs[1:]) / len(epochs[1:])) if len(epochs) > 1 else None,
            "accuracy": num(kv.get("accuracy")), "device": kv.get("device")}


def result_lines(text):
    """The `result key=value ...` lines of bench/lm_gpu_torch.py and bench_attention, as dicts."""
    out = []
    for m in re.finditer(r"^result (.*)$", text or "", re.M):
        out.append({k: (num(v) if re.fullmatch(r"-?[\d.]+(e-?\d+)?", v) else v)
                    for k, v in (p.split("=", 1) for p in m.group(1).split() if "=" in p)})
    return out


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def finetune_steps(text):
    """`ember finetune`'s progress lines: step, tokens/s, the peaks it prints by name (MB, as printed)."""
    steps = []
    for m in re.finditer(r"^step (\d+)/(\d+) .*?tokens/s ([\d.]+)(.*)$", text or "", re.M):
        peaks = {k: num(v) for k, v in re.findall(r"(peak_\w+|rss_growth) ([\d.]+) MB", m.group(4))}
        steps.append({"step": int(m.group(1)), "tokens_per_s": num(m.group(3)), "peaks_MB": peaks})
    return steps


GPT2_FLOPS_PER_TOKEN = 6 * 124439808 + 6 * 12 * 1024 * 768  # GPT-2 124M at 1024 (bench/lm_gpu_torch.py's count)


def lm_figures(facts, fig):
    """The language-model steps' figures, each beside PyTorch's and the roofline."""
    j = lambda name: read_json(os.path.join(facts, name))
    t = lambda name: read(os.path.join(facts, name))
    bw = (fig.get("roofline_torch") or {}).get("copy_traffic_GBps")
    lm = {}
    dec = {}
    for key, name in (("ember", "lm_decode_ember.json"), ("ember_no_graphs", "lm_decode_ember_nographs.json")):
        e = j(name)
        if e and e.get("decode_seconds"):
            tps = e["decode_tokens"] / e["decode_seconds"]
            gbps = (e.get("weight_bytes") or 0) * tps / 1e9
            dec[key] = {"prefill_tokens_per_s": e.get("prompt_tokens_per_s"), "decode_tokens_per_s": round(tps, 2),
                        "weight_GBps": round(gbps, 1), "fraction_of_measured_bw": frac(gbps, bw),
                        "fraction_of_spec_bw": frac(gbps, SPEC["hbm_GBps"]), "device": e.get("device")}
    tr = result_lines(t("lm_decode_torch.txt"))
    if tr:
        r = tr[-1]
        dec["torch"] = {"prefill_tokens_per_s": r.get("prefill_tokens_per_s"),
                        "decode_tokens_per_s": r.get("decode_tokens_per_s"), "weight_GBps": r.get("weight_GBps"),
                        "fraction_of_measured_bw": frac(r.get("weight_GBps"), bw)}
    if "ember" in dec and "torch" in dec and dec["torch"]["decode_tokens_per_s"]:
        dec["ember_over_torch_decode"] = round(dec["ember"]["decode_tokens_per_s"] / dec["torch"]["decode_tokens_per_s"], 3)
    if dec:
        dec["measured_bw_GBps"] = bw
        lm["decode"] = dec
    g = {}
    steps = finetune_steps(t("gpt2_train_ember.txt"))
    if steps:
        after = [s["tokens_per_s"] for s in steps[2:]] or [s["tokens_per_s"] for s in steps]
        tps = median(after)
        g["ember"] = {"tokens_per_s": tps, "steps": len(steps),
                      "mfu": frac(tps * GPT2_FLOPS_PER_TOKEN / 1e12, SPEC["matmul_TFLOPs"]["bf16"]) if tps else None}
    for key, name in (("torch", "gpt2_train_torch.txt"), ("torch_compile", "gpt2_train_compile.txt")):
        r = result_lines(t(name))
        if r:
            g[key] = {"tokens_per_s": r[-1].get("tokens_per_s"), "mfu": r[-1].get("mfu"), "step_ms": r[-1].get("step_ms")}
    for key in ("torch", "torch_compile"):
        if "ember" in g and key in g and g["ember"]["tokens_per_s"] and g[key]["tokens_per_s"]:
            g[f"ember_over_{key}"] = round(g["ember"]["tokens_per_s"] / g[key]["tokens_per_s"], 3)
    if g:
        lm["gpt2_train"] = g
    att = {}
    for r in result_lines(t("attention_ember.txt")) + result_lines(t("attention_torch.txt")):
        att.setdefault(int(r.get("seq", 0)), {})[r.get("impl")] = {
            "fwd_tflops": r.get("fwd_tflops"), "fwd_bwd_tflops": r.get("fwd_bwd_tflops"), "fused": r.get("fused")}
    rows = []
    for n in sorted(att):
        e, p = att[n].get("ember"), att[n].get("torch")
        rows.append({"seq": n, "ember": e, "torch": p,
                     "ember_over_torch_fwd_bwd": round(e["fwd_bwd_tflops"] / p["fwd_bwd_tflops"], 3)
                     if e and p and e.get("fwd_bwd_tflops") and p.get("fwd_bwd_tflops") else None})
    if rows:
        lm["attention"] = rows
    steps = finetune_steps(t("lora_7b_ember.txt"))
    if steps:
        lm["lora_7b"] = {"steps": len(steps), "tokens_per_s": steps[-1]["tokens_per_s"],
                         "peaks_MB": steps[-1]["peaks_MB"]}
    on, off = parse_ember_train(t("mlp_graphs_on.log")), parse_ember_train(t("mlp_graphs_off.log"))
    if on and off:
        a, b = on.get("s_per_epoch_after_first") or on["s_per_epoch"], off.get("s_per_epoch_after_first") or off["s_per_epoch"]
        lm["mlp_graphs"] = {"s_per_epoch_graphs": a, "s_per_epoch_no_graphs": b,
                            "speedup": round(b / a, 3) if a else None}
    if lm:
        fig["lm"] = lm


def figures(facts):
    j = lambda name: read_json(os.path.join(facts, name))
    t = lambda name: read(os.path.join(facts, name))
    bench, bench32, rf = j("bench.json"), j("bench_tf32.json"), j("roofline_torch.json")
    fig = {}
    if rf:
        fig["roofline_torch"] = rf
    if bench:
        fig["matmul"] = matmul_rows(bench, rf)
        fig["copy"] = copy_rows(bench)
        launch = bench.get("launch") or {}
        fig["launch_us"] = {k: (launch.get(k) or {}).get("us_per_op") for k in ("queued", "synced", "cpu_queued")}
        xo = bench.get("crossover") or {}
        fig["crossover"] = {k: {"device_faster_from": (xo.get(k) or {}).get("device_faster_from"),
                                "device_with_copies_faster_from": (xo.get(k) or {}).get("device_with_copies_faster_from")}
                            for k in ("matmul", "add")} if not xo.get("skipped") else {"skipped": xo.get("reason")}
    if bench32:
        fig["matmul_tf32"] = matmul_rows(bench32, rf, tf32=True)
    cpu = j("bench_cpu.json")
    if cpu:
        fig["cpu_matmul"] = [{"dtype": r.get("dtype"), "n": r.get("n"), "gflops": r.get("gflops")}
                             for r in (cpu.get("matmul") or {}).get("results", [])]
    dc = t("device_copy.txt")
    m = re.search(r"bytes=(\d+) seconds=(\S+) traffic_GBps=(\S+)", dc or "")
    if m:
        gb = num(m.group(3))
        measured = (rf or {}).get("copy_traffic_GBps")
        fig["device_copy"] = {"bytes": int(m.group(1)), "traffic_GBps": gb, "spec_GBps": SPEC["hbm_GBps"],
                              "fraction_of_spec": frac(gb, SPEC["hbm_GBps"]), "torch_traffic_GBps": measured,
                              "fraction_of_torch": frac(gb, measured)}
    train = {}
    logs = {"ember_cuda": "train_cuda.log", "ember_cpu": "train_cpu.log", "torch_cuda": "train_torch.log",
            "ember_cuda_amp_bf16": "train_amp_bf16.log", "ember_cuda_amp_f16": "train_amp_f16.log",
            "ember_cuda_cnn": "train_cnn_cuda.log", "torch_cuda_cnn": "train_cnn_torch.log"}
    for key, log in logs.items():
        parse = parse_torch_train if key.startswith("torch_") else parse_ember_train
        r = parse(t(log))
        if r:
            train[key] = r
    if "ember_cuda" in train and "torch_cuda" in train and train["ember_cuda"]["s_per_epoch"]:
        train["torch_over_ember_s_per_epoch"] = round(train["torch_cuda"]["s_per_epoch"] / train["ember_cuda"]["s_per_epoch"], 3)
        # the first epoch holds Ember's kernel compiles when the machine's cache is empty
        e, p = train["ember_cuda"].get("s_per_epoch_after_first"), train["torch_cuda"].get("s_per_epoch_after_first")
        if e and p:
            train["torch_over_ember_after_first"] = round(p / e, 3)
    if "ember_cuda_cnn" in train and "torch_cuda_cnn" in train:
        e, p = train["ember_cuda_cnn"].get("s_per_epoch_after_first"), train["torch_cuda_cnn"].get("s_per_epoch_after_first")
        if e and p:
            train["cnn_torch_over_ember_after_first"] = round(p / e, 3)
    if train:
        fig["train"] = train
    san = t("sanitizers")
    if san:
        fig["sanitizers"] = san.strip().splitlines()
    smi = t("smi_compare.txt")
    if smi:
        fig["smi_compare"] = smi.strip().splitlines()
    lm_figures(facts, fig)
    return fig


def machine(facts):
    m = {}
    csv = read(os.path.join(facts, "nvidia_smi_gpu.csv"))
    rows = csv_rows(csv)
    if len(rows) >= 2 and not rows[0][0].startswith("NVIDIA-SMI has failed"):
        m["gpus"] = [dict(zip(rows[0], r)) for r in rows[1:]]
    for key, name in (("commit", "commit"), ("torch", "torch_version")):
        v = read(os.path.join(facts, name))
        if v:
            m[key] = v.strip()
    dev = read_json(os.path.join(facts, "devices.json"))
    if dev:
        for tp in dev.get("types", []):
            if tp.get("type") == "cpu" and tp.get("devices"):
                m["cpu"] = tp["devices"][0].get("name")
                m["cpu_gemm"] = tp["devices"][0].get("driver")
            if tp.get("type") == "cuda":
                m["ember_cuda"] = "available" if tp.get("available") else f"not available: {tp.get('reason')}"
    found = read(os.path.join(facts, "cmake_found"))
    if found:
        m["cmake_found"] = found.strip().splitlines()
    return m


def write_md(rep, path):
    L = []
    a = L.append
    a(f"# Ember GPU check, {rep['tag']}{' (dry run)' if rep['dry_run'] else ''}\n")
    s = rep["summary"]
    a(f"{rep['generated_utc']}, commit {rep['machine'].get('commit', 'unknown')}: **{s['verdict']}** "
      f"({s['pass']} pass, {s['fail']} fail, {s['skip']} skip)\n")
    a("## Summary\n")
    mc = rep["machine"]
    for g in mc.get("gpus", []):
        a(f"- GPU: {', '.join(f'{k.strip()} {v}' for k, v in g.items())}")
    for k in ("cpu", "cpu_gemm", "ember_cuda", "torch"):
        if k in mc:
            a(f"- {k}: {mc[k]}")
    fig = rep["figures"]
    if "device_copy" in fig:
        d = fig["device_copy"]
        a(f"- device-to-device copy (Ember): {fmt(d['traffic_GBps'], 0)} GB/s = {pct(d['fraction_of_spec'])} of "
          f"{d['spec_GBps']:.0f} GB/s spec, {pct(d['fraction_of_torch'])} of PyTorch's {fmt(d['torch_traffic_GBps'], 0)} GB/s")
    for r in fig.get("matmul", []) + fig.get("matmul_tf32", []):
        if r["n"] == 8192:
            a(f"- matmul {r['dtype']} 8192: {fmt(r['tflops'])} TFLOP/s = {pct(r['fraction_of_spec'])} of spec, "
              f"{pct(r['fraction_of_torch'])} of PyTorch")
    tr = fig.get("train", {})
    for k in TRAIN_RUNS:
        if k in tr:
            a(f"- train {k}: {fmt(tr[k]['s_per_epoch'], 2)} s/epoch (best {fmt(tr[k]['best_s_per_epoch'], 2)}), "
              f"accuracy {fmt(tr[k]['accuracy'], 2)}%")
    a("")
    a("## Steps\n")
    a("| step | status | seconds | limit | note |")
    a("|---|---|---:|---:|---|")
    for st in rep["steps"]:
        a(f"| {st['name']} | {st['status']} | {st['seconds']} | {st['limit_s']} | {st['note'].replace('|', '/')} |")
    a("\nEach step's output: logs-*.tar.gz, logs-*/<step>.log.\n")
    if fig.get("matmul") or fig.get("matmul_tf32"):
        a("## Matmul (ember bench --device cuda:0; fractions of the spec peak and of PyTorch on this GPU)\n")
        a("| dtype | n | TFLOP/s | spec | of spec | PyTorch | of PyTorch |")
        a("|---|---:|---:|---:|---:|---:|---:|")
        for r in fig.get("matmul", []) + fig.get("matmul_tf32", []):
            a(f"| {r['dtype']} | {r['n']} | {fmt(r['tflops'])} | {fmt(r['spec_tflops'])} | {pct(r['fraction_of_spec'])} | "
              f"{fmt(r['torch_tflops'])} | {pct(r['fraction_of_torch'])} |")
        a("")
    if fig.get("copy"):
        a(f"## Host <-> device copies (fraction of PCIe 5.0 x16, {SPEC['pcie_GBps_per_direction']:.0f} GB/s per direction, spec)\n")
        a("| bytes | kind | GB/s | of spec |")
        a("|---:|---|---:|---:|")
        for r in fig["copy"]:
            a(f"| {r['bytes']} | {r['kind']} | {fmt(r['GBps'])} | {pct(r['fraction_of_pcie_spec'])} |")
        a("")
    if fig.get("launch_us"):
        lu = fig["launch_us"]
        a(f"## Launch latency\n\nqueued {fmt(lu.get('queued'), 2)} us, synchronized {fmt(lu.get('synced'), 2)} us "
          f"(CPU op: {fmt(lu.get('cpu_queued'), 3)} us)\n")
    if fig.get("crossover"):
        a(f"## Crossover (sizes from which cuda:0 beats the CPU)\n\n```\n{json.dumps(fig['crossover'], indent=1)}\n```\n")
    if fig.get("cpu_matmul"):
        a("## CPU matmul (ember bench --device cpu)\n")
        for r in fig["cpu_matmul"]:
            a(f"- {r['dtype']} n={r['n']}: {fmt(r['gflops'])} GFLOP/s")
        a("")
    if tr:
        a("## Training (Adam, batch 64, same batches; the 784-256-10 MLP, or the CNN where named)\n")
        a("| run | epochs | s/epoch | best | after the first | accuracy |")
        a("|---|---:|---:|---:|---:|---:|")
        for k in TRAIN_RUNS:
            if k in tr:
                r = tr[k]
                a(f"| {k} | {r['epochs']} | {fmt(r['s_per_epoch'], 3)} | {fmt(r['best_s_per_epoch'], 3)} | "
                  f"{fmt(r['s_per_epoch_after_first'], 3)} | {fmt(r['accuracy'], 2)}% |")
        if "torch_over_ember_s_per_epoch" in tr:
            after = tr.get("torch_over_ember_after_first")
            a(f"\nPyTorch s/epoch over Ember's: {tr['torch_over_ember_s_per_epoch']} over all epochs"
              + (f", {after} after the first (which holds Ember's kernel compiles when the cache is empty)" if after else ""))
        if "cnn_torch_over_ember_after_first" in tr:
            a(f"\nThe CNN: PyTorch's s/epoch over Ember's after the first: {tr['cnn_torch_over_ember_after_first']}")
        a("")
    lm = fig.get("lm") or {}
    if lm:
        a("## Language models\n")
        d = lm.get("decode") or {}
        if d:
            a(f"Llama-3.2-1B-shaped, bf16, a 512-token prompt then greedy decoding; the bandwidth is the weight bytes a "
              f"token reads times decode tokens/s, beside PyTorch's measured copy traffic ({fmt(d.get('measured_bw_GBps'), 0)} GB/s)\n")
            a("| run | prefill tok/s | decode tok/s | GB/s | of measured | of spec |")
            a("|---|---:|---:|---:|---:|---:|")
            for k in ("ember", "ember_no_graphs", "torch"):
                if k in d:
                    r = d[k]
                    a(f"| {k} | {fmt(r.get('prefill_tokens_per_s'))} | {fmt(r.get('decode_tokens_per_s'), 2)} | "
                      f"{fmt(r.get('weight_GBps'), 0)} | {pct(r.get('fraction_of_measured_bw'))} | {pct(r.get('fraction_of_spec_bw'))} |")
            if "ember_over_torch_decode" in d:
                a(f"\nEmber's decode tokens/s over PyTorch's: {d['ember_over_torch_decode']}")
            a("")
        g = lm.get("gpt2_train") or {}
        if g:
            a("GPT-2 124M training, batch 8 x 1024, bf16 autocast, AdamW\n")
            a("| run | tokens/s | MFU |")
            a("|---|---:|---:|")
            for k in ("ember", "torch", "torch_compile"):
                if k in g:
                    a(f"| {k} | {fmt(g[k].get('tokens_per_s'), 0)} | {pct(g[k].get('mfu'))} |")
            for k in ("ember_over_torch", "ember_over_torch_compile"):
                if k in g:
                    a(f"\n{k}: {g[k]}")
            a("")
        if lm.get("attention"):
            a("Causal bf16 attention, batch 4, 16 heads of 64: forward + backward TFLOP/s\n")
            a("| seq | Ember | PyTorch SDPA | Ember / PyTorch |")
            a("|---:|---:|---:|---:|")
            for r in lm["attention"]:
                a(f"| {r['seq']} | {fmt((r['ember'] or {}).get('fwd_bwd_tflops'))} | {fmt((r['torch'] or {}).get('fwd_bwd_tflops'))} | "
                  f"{r['ember_over_torch_fwd_bwd'] if r['ember_over_torch_fwd_bwd'] is not None else '-'} |")
            a("")
        if lm.get("lora_7b"):
            r = lm["lora_7b"]
            a(f"LoRA step of the Llama-2-7B-shaped model under EMBER_MEMORY_CAP=cuda=24GiB: {r['steps']} steps, "
              f"{fmt(r['tokens_per_s'], 0)} tokens/s, " + ", ".join(f"{k} {v} MB" for k, v in r['peaks_MB'].items()) + "\n")
        if lm.get("mlp_graphs"):
            r = lm["mlp_graphs"]
            a(f"The seed MLP's epoch: {fmt(r['s_per_epoch_graphs'], 3)} s with CUDA graphs, "
              f"{fmt(r['s_per_epoch_no_graphs'], 3)} s without ({r['speedup']}x)\n")
    for key, title in (("sanitizers", "compute-sanitizer"), ("smi_compare", "ember smi / devices against nvidia-smi")):
        if fig.get(key):
            a(f"## {title}\n\n```\n" + "\n".join(fig[key]) + "\n```\n")
    a(f"Spec figures: {SPEC['source']}.")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(L) + "\n")


def report(a):
    steps = []
    text = read(os.path.join(a.logs, "steps.tsv")) or ""
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) < 6:
            continue
        name, status, rc, secs, limit, note = parts[:6]
        steps.append({"name": name, "status": status, "rc": int(rc) if rc.lstrip("-").isdigit() else None,
                      "seconds": int(secs) if secs.isdigit() else 0, "limit_s": int(limit) if limit.isdigit() else None,
                      "note": note, "log": f"logs-{a.tag}/{name}.log"})
    counts = {k: sum(1 for s in steps if s["status"] == k) for k in ("pass", "fail", "timeout", "skip")}
    failed = counts["fail"] + counts["timeout"]
    verdict = "FAIL" if failed else ("PASS" if counts["pass"] and not counts["skip"] else
                                     "PASS with skips" if counts["pass"] else "NOTHING RAN")
    facts = os.path.join(a.logs, "facts")
    mc = machine(facts)
    global SPEC
    SPEC = pick_spec(mc)
    rep = {"schema": 1, "part": a.part, "tag": a.tag, "dry_run": a.dry_run == "1",
           "generated_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
           "machine": mc,
           "summary": {"verdict": verdict, "pass": counts["pass"], "fail": failed, "skip": counts["skip"],
                       "steps": len(steps)},
           "steps": steps, "figures": figures(facts), "spec": SPEC}
    with open(a.json, "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=1)
        f.write("\n")
    write_md(rep, a.md)
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "compare-smi":
        if len(sys.argv) not in (5, 6):
            sys.exit("usage: gpu_report.py compare-smi FIELDS EMBER_CSV NVIDIA_CSV [DEVICES_JSON]")
        return compare_smi(*sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["report"])
    ap.add_argument("--part", required=True)
    ap.add_argument("--tag", help="the report's name: partN, proof, quick, lm or all (default: from --part)")
    ap.add_argument("--dry-run", default="0")
    ap.add_argument("--logs", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    if not a.tag:
        a.tag = a.part if a.part in ("all", "proof", "lm", "quick") else f"part{a.part}"
    return report(a)


if __name__ == "__main__":
    sys.exit(main())
