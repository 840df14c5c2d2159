#!/usr/bin/env bash
# CI's check of the GPU proof scripts on a machine without a GPU (docs/GPU_CHECK.md):
#  1. scripts/gpu_check.sh --dry-run (reusing a build directory), the one-call proof and then
#     --part all, each exits 0 and leaves exactly its report-TAG.md, report-TAG.json and
#     logs-TAG.tar.gz; the JSON has a status for every step, every GPU step is a skip that
#     says why, the others pass (the language-model steps on the CPU with tiny folders, their
#     figures read back); the archive holds a log per step that ran.
#     --only runs just the named steps after the four that everything stands on.
#  2. Bad arguments exit 2 with a message.
#  3. gpu_report.py turns made-up GPU figures into the right roofline fractions, and its
#     smi comparison accepts agreeing tools and rejects a differing field.
# Usage: scripts/gpu_check_test.sh [build-dir]   (default build; built by scripts/test.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
PY=${PYTHON:-python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "gpu_check_test: FAIL: $*" >&2; exit 1; }

# 1. the dry run: the one-call proof (the default), then every step (--part all)
scripts/gpu_check.sh "$T/proof" --dry-run --build-dir "$BUILD" >"$T/proof.log" 2>&1 || { cat "$T/proof.log"; fail "proof dry run exited $?"; }
[ "$(ls "$T/proof" | sort | tr '\n' ' ')" = "logs-proof.tar.gz report-proof.json report-proof.md " ] ||
    fail "expected exactly the three report files, found: $(ls "$T/proof")"
"$PY" - "$T/proof/report-proof.json" <<'EOF' || fail "report-proof.json has the wrong shape"
import json, sys
r = json.load(open(sys.argv[1]))
gpu = {"golden", "lm_decode_torch", "gpt2_train_torch", "attention_torch", "mlp_graphs", "gpt2_train_compile",
       "train_cuda", "train_torch", "copy_d2d", "roofline_torch", "memcheck"}
cpu = {"preflight", "deps", "build", "devices", "lm_models", "lm_decode", "gpt2_train", "attention", "lora_7b",
       "zero_nccl"}
names = [s["name"] for s in r["steps"]]
assert set(names) == gpu | cpu and len(names) == len(set(names)), f"steps {names}"
assert names[:5] == ["preflight", "deps", "build", "devices", "golden"], names  # most telling first
for s in r["steps"]:
    if s["name"] in gpu:
        assert s["status"] == "skip" and "no driver" in s["note"], s
    else:
        assert s["status"] == "pass", s
assert r["dry_run"] is True and r["part"] == "proof" and r["tag"] == "proof"
lm = r["figures"]["lm"]
assert lm["decode"]["ember"]["decode_tokens_per_s"] > 0 and lm["decode"]["ember"]["prefill_tokens_per_s"] > 0, lm
assert lm["gpt2_train"]["ember"]["tokens_per_s"] > 0, lm
assert [a["seq"] for a in lm["attention"]] == [64, 128] and all(a["ember"]["fwd_bwd_tflops"] >= 0 for a in lm["attention"])
assert lm["lora_7b"]["steps"] == 3 and lm["lora_7b"]["peaks_MB"], lm
EOF
grep -q "^## Language models" "$T/proof/report-proof.md" || fail "report-proof.md has no language-model section"

scripts/gpu_check.sh "$T/out" --dry-run --part all --build-dir "$BUILD" >"$T/dry.log" 2>&1 || { cat "$T/dry.log"; fail "dry run of every step exited $?"; }
[ "$(ls "$T/out" | sort | tr '\n' ' ')" = "logs-all.tar.gz report-all.json report-all.md " ] ||
    fail "expected exactly the three report files, found: $(ls "$T/out")"
"$PY" - "$T/out/report-all.json" <<'EOF' || fail "report-all.json has the wrong shape"
import json, sys
r = json.load(open(sys.argv[1]))
gpu = {"ctest", "blocking", "memcheck", "racecheck", "synccheck", "smi", "bench", "copy_d2d", "roofline_torch",
       "train_cuda", "train_torch", "train_amp", "nccl", "train_cnn", "train_cnn_torch", "lm_decode_torch",
       "gpt2_train_torch", "attention_torch", "mlp_graphs", "gpt2_train_compile"}
cpu = {"preflight", "deps", "build", "devices", "bench_cpu", "train_cpu", "lm_models", "lm_decode", "gpt2_train",
       "attention", "lora_7b", "zero_nccl"}
names = [s["name"] for s in r["steps"]]
assert set(names) == gpu | cpu, f"steps {names}"
for s in r["steps"]:
    assert s["status"] in ("pass", "fail", "skip", "timeout"), s
    assert isinstance(s["seconds"], int) and s["limit_s"] > 0, s
    if s["name"] in gpu:
        assert s["status"] == "skip" and "no driver" in s["note"], s
    else:
        assert s["status"] == "pass", s
# the decode's graph line: on the CPU the steps stay eager, and the note says why
lm = next(s for s in r["steps"] if s["name"] == "lm_decode")
assert "cuda graph: off (" in lm["note"], lm
assert r["dry_run"] is True and r["part"] == "all"
assert r["summary"]["fail"] == 0 and r["summary"]["skip"] == len(gpu) and r["summary"]["verdict"] == "PASS with skips"
assert r["machine"]["cpu_gemm"].startswith(("OpenBLAS", "built-in (")), r["machine"]
assert r["figures"]["cpu_matmul"] and all(x["gflops"] > 0 for x in r["figures"]["cpu_matmul"])
assert r["figures"]["train"]["ember_cpu"]["accuracy"] > 10
assert r["spec"]["hbm_GBps"] == 4800.0
EOF
grep -q "^## Steps" "$T/out/report-all.md" || fail "report-all.md has no Steps section"
tar -tzf "$T/out/logs-all.tar.gz" >"$T/list"
for s in preflight build devices bench_cpu train_cpu lm_decode; do
    grep -qx "logs-all/$s.log" "$T/list" || fail "logs-all.tar.gz has no $s.log"
done

# --only: those steps after preflight, deps, build and devices
scripts/gpu_check.sh "$T/only" --dry-run --build-dir "$BUILD" --part 1 --only train_cpu >"$T/only.log" 2>&1 ||
    { cat "$T/only.log"; fail "--only train_cpu exited $?"; }
"$PY" -c 'import json, sys; r = json.load(open(sys.argv[1]))
assert [(s["name"], s["status"]) for s in r["steps"]] == [(n, "pass") for n in ("preflight", "deps", "build", "devices", "train_cpu")], r["steps"]
assert r["part"] == "1"' "$T/only/report-part1.json" || fail "--only ran the wrong steps"

# 2. argument errors
for args in "" "$T/x --part 3" "$T/x --budget soon" "$T/x --bogus" "$T/x $T/y" "$T/x --part 1 --quick"; do
    # shellcheck disable=SC2086  # the words are the arguments
    rc=0; scripts/gpu_check.sh $args >"$T/err" 2>&1 || rc=$?
    [ "$rc" = 2 ] && grep -q "gpu_check:" "$T/err" || fail "gpu_check.sh $args: expected exit 2 and a message, got $rc"
done

# 3. figures from made-up GPU results, and the smi comparison
L=$T/logs && mkdir -p "$L/facts"
printf 'bench\tpass\t0\t100\t180\t\ncopy_d2d\tfail\t1\t3\t60\tboom\n' >"$L/steps.tsv"
cat >"$L/facts/bench.json" <<'EOF'
{"matmul": {"results": [{"dtype": "bf16", "n": 8192, "tflops": 494.75}, {"dtype": "f32", "n": 8192, "tflops": 33.5}]},
 "copy": {"results": [{"bytes": 67108864, "h2d_pinned": {"gb_per_s": 32.0}}]},
 "launch": {"queued": {"us_per_op": 4.5}}, "crossover": {"skipped": false, "matmul": {"device_faster_from": 256}}}
EOF
echo '{"copy_traffic_GBps": 4000.0, "matmul_TFLOPs": {"bf16": 791.6, "f32": 50.0}}' >"$L/facts/roofline_torch.json"
echo 'device_copy device=cuda:0 bytes=1073741824 seconds=0.0005 traffic_GBps=3600.0' >"$L/facts/device_copy.txt"
printf 'epoch 1/2: train loss 0.5, test accuracy 84.00%%, test loss 0.4, 60000 samples/s (1.00 s), memory x\nepoch 2/2: train loss 0.4, test accuracy 86.50%%, test loss 0.4, 120000 samples/s (0.50 s), memory x\n' >"$L/facts/train_cuda.log"
echo 'result device=cuda:0 batch=64 threads=16 epochs=2 s_per_epoch=1.5000 best_s_per_epoch=1.2 samples_per_s=40000 accuracy=86.40' >"$L/facts/train_torch.log"
"$PY" scripts/gpu_report.py report --part 2 --logs "$L" --md "$T/r.md" --json "$T/r.json"
"$PY" - "$T/r.json" <<'EOF' || fail "figures computed wrongly from made-up results"
import json, sys
r = json.load(open(sys.argv[1]))
f = r["figures"]
bf = next(x for x in f["matmul"] if x["dtype"] == "bf16")
assert abs(bf["fraction_of_spec"] - 0.5) < 1e-3 and abs(bf["fraction_of_torch"] - 0.625) < 1e-3, bf
f32 = next(x for x in f["matmul"] if x["dtype"] == "f32")
assert abs(f32["fraction_of_spec"] - 0.5) < 1e-3, f32
assert abs(f["device_copy"]["fraction_of_spec"] - 0.75) < 1e-4 and abs(f["device_copy"]["fraction_of_torch"] - 0.9) < 1e-4
cp = next(x for x in f["copy"] if x["kind"] == "h2d_pinned")
assert abs(cp["fraction_of_pcie_spec"] - 0.5) < 1e-4, cp
assert f["train"]["ember_cuda"]["s_per_epoch"] == 0.75 and f["train"]["ember_cuda"]["accuracy"] == 86.5
assert f["train"]["torch_over_ember_s_per_epoch"] == 2.0, f["train"]
assert r["summary"]["verdict"] == "FAIL" and r["summary"]["fail"] == 1 and r["steps"][1]["note"] == "boom"
EOF
grep -q "| bf16 | 8192 | 494.8 | 989.5 | 50.0% |" "$T/r.md" || fail "r.md lacks the bf16 row"

F=name,index,memory.total,memory.used,temperature.gpu,compute_cap
echo 'NVIDIA H200, 0, 143771, 600, 31, 9.0' >"$T/n.csv"
echo 'NVIDIA H200, 0, 143771, 1000, 33, 9.0' >"$T/e.csv"
echo '{"types": [{"type": "cuda", "devices": [{"name": "NVIDIA H200", "total_memory": 150754820096, "compute_capability": "9.0"}]}]}' >"$T/d.json"
"$PY" scripts/gpu_report.py compare-smi "$F" "$T/e.csv" "$T/n.csv" "$T/d.json" >"$T/c.txt" || { cat "$T/c.txt"; fail "agreeing tools rejected"; }
echo '{"types": [{"type": "cuda", "devices": [{"name": "NVIDIA H200", "total_memory": 150754820096, "compute_capability": "8.0"}]}]}' >"$T/d8.json"
if "$PY" scripts/gpu_report.py compare-smi "$F" "$T/e.csv" "$T/n.csv" "$T/d8.json" >"$T/c.txt"; then fail "a differing compute capability accepted"; fi
echo 'NVIDIA H100, 0, 143771, 600, 31, 9.0' >"$T/e.csv"
if "$PY" scripts/gpu_report.py compare-smi "$F" "$T/e.csv" "$T/n.csv" >"$T/c.txt"; then fail "a differing name accepted"; fi
grep -q "gpu 0 name .*MISMATCH" "$T/c.txt" || fail "the mismatch is not shown"
echo "gpu_check_test: ok (dry run, argument errors, figures, smi comparison)"
