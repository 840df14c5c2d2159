#!/usr/bin/env python3
"""Where `ember train`'s step goes: reads `perf script -F comm,tid,ip,sym,dso` of a
`perf record --call-graph dwarf` run (bench/profile_train.sh makes one) and sorts every
sample into one category by its stack; prints each category's share of the training loop's
samples and its top leaf functions. Samples outside the loop (dataset parse, evaluation,
start-up) and on the loader's producer thread (overlapped with the step) are counted apart.
oneDNN's JIT GEMM kernels have no unwind information: their samples have no stack and are
recognised by their code living in no file (perf's "perf-PID.map" / "[unknown]" dso)."""
import collections
import re
import sys

OUTSIDE = ("mlp_dataset", "mlp_new", "mlp_evaluate", "em_loader_new", "em_memory_empty_cache",
           "_dl_start_user", "call_init", "_dl_init", "exit", "__libc_start_call_main_exit")
LOOP = ("em_forward", "em_backward_with", "em_backward", "em_step", "em_zero_grad", "em_cross_entropy",
        "em_loader_next", "em_add_", "em_scope_end", "em__scope_return", "em_detach")
ALLOC = re.compile(r"^(malloc|free|calloc|realloc|_int_malloc|_int_free|tcache_|malloc_consolidate|cfree|"
                   r"__libc_calloc|__libc_malloc|__libc_free|em__mem_|mem__|tree_|em__storage_|em__tensor_alloc|"
                   r"unlink_chunk|posix_memalign|_mid_memalign)")
KERNELS = re.compile(r"^(bin_|un_|where_|cast_|outer_|inner_|reduce_|acc_|store_result|iter_range|binary_blocks|"
                     r"unary|binary_scalar|em__cpu_|__memmove|__memcpy|__memset|copy_|fill_|softmax|log_softmax|__expf|__logf|"
                     r"expf|logf|exp|log)")


def parse(f):
    cur = None
    for line in f:
        line = line.rstrip("\n")
        if not line.strip():
            if cur is not None:
                yield cur
            cur = None
            continue
        if not line.startswith("\t"):
            cur = []
            continue
        m = re.match(r"\s+[0-9a-f]+ (.*?) \((.*)\)$", line)
        if m and cur is not None:
            cur.append((m.group(1), m.group(2).rsplit("/", 1)[-1]))
    if cur:
        yield cur


def category(stack):
    names = [n for n, _ in stack]
    leaf, dso = stack[0] if stack else ("?", "?")
    if dso.startswith("perf-") or (dso == "[unknown]" and leaf == "[unknown]" and len(stack) <= 2):
        return "GEMM (oneDNN JIT kernels)"
    if any(n in OUTSIDE for n in names):
        return "outside the loop"
    if "producer" in names:
        return "loader thread (overlapped)"
    if not any(n in LOOP for n in names) and "cmd_train" not in names:
        return "unattributed (stack lost)"
    if dso.startswith("libopenblas") or dso.startswith("libdnnl") or any(
            n.startswith(("sgemm", "cblas_", "dnnl_sgemm", "gemm_run")) for n in names):
        return "GEMM (OpenBLAS, oneDNN driver and packing)"
    if "em_step" in names or "em_zero_grad" in names:
        return "optimizer (fused Adam, zero_grad)"
    if "em_loader_next" in names:
        return "loader hand-off (main thread)"
    if "em_cross_entropy" in names or leaf.startswith(("softmax", "log_softmax")):
        return "loss (cross-entropy forward, softmax kernels)"
    if ALLOC.match(leaf) or dso == "[kernel.kallsyms]":
        return "allocator, page faults, kernel"
    if KERNELS.match(leaf) or dso.startswith("libm"):
        return "elementwise / reductions (relu, where, bias grad sum, loss backward)"
    return "dispatch, autograd, scopes (everything else)"


def main():
    cats = collections.Counter()
    leaves = collections.defaultdict(collections.Counter)
    for stack in parse(sys.stdin):
        c = category(stack)
        cats[c] += 1
        leaves[c][stack[0][0] if stack else "?"] += 1
    apart = ("outside the loop", "loader thread (overlapped)", "unattributed (stack lost)")
    loop = sum(v for k, v in cats.items() if k not in apart)
    print(f"training loop (main thread): {loop} samples")
    print(f"{'category':<72} {'samples':>8} {'share':>7}  top leaves")
    for k, v in sorted(cats.items(), key=lambda kv: (kv[0] in apart, -kv[1])):
        share = f"{100 * v / loop:6.1f}%" if k not in apart and loop else "      -"
        top = ", ".join(f"{n} {c}" for n, c in leaves[k].most_common(4))
        print(f"{k:<72} {v:>8} {share}  {top}")


if __name__ == "__main__":
    main()
