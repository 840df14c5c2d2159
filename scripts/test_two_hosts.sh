#!/usr/bin/env bash
# Distributed training across two "hosts": two network namespaces joined by a veth pair
# (10.77.x.1 and 10.77.x.2), Open MPI between them over TCP only (no shared memory), its
# launcher reaching the second namespace through an rsh agent that runs `ip netns exec`
# instead of ssh. Runs tests/test_dist.c's collectives + DDP checks (params bit-identical
# after every step, 2 ranks x 32 following 1 x 64), tests/test_dist_allreduce.c's algorithm
# checks, and `ember train` with DDP across them,
# and checks the veth counters: the traffic went through the link the test made.
#   scripts/test_two_hosts.sh [build-dir]     (root needed; skips, exit 77, when netns is not permitted)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
skip() { echo "SKIP test_two_hosts: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "iproute2 is not installed"
command -v mpirun >/dev/null || skip "mpirun is not installed (openmpi-bin)"
[ -x "$build/test_dist" ] && [ -x "$build/ember" ] || skip "$build/test_dist or $build/ember is not built"
build="$(cd "$build" && pwd)"

id=$(( $$ % 200 + 20 ))
nsa="emd${id}a" nsb="emd${id}b" net="10.77.${id}"
tmp="$(mktemp -d)"
cleanup() { ip netns del "$nsa" 2>/dev/null || true; ip netns del "$nsb" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
ip netns add "$nsa" 2>/dev/null || skip "ip netns add is not permitted here (a container without CAP_SYS_ADMIN?)"
ip netns add "$nsb"
ip link add "${nsa}0" type veth peer name "${nsb}0"
ip link set "${nsa}0" netns "$nsa"
ip link set "${nsb}0" netns "$nsb"
ip -n "$nsa" addr add "$net.1/24" dev "${nsa}0"
ip -n "$nsb" addr add "$net.2/24" dev "${nsb}0"
for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up; ip -n "$ns" link set "${ns}0" up; done

# mpirun's rsh agent: "agent [options] HOST COMMAND..." runs COMMAND in HOST's namespace
cat > "$tmp/agent" <<AGENT
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host="\$1"; shift
case "\$host" in $net.1) ns=$nsa ;; $net.2) ns=$nsb ;; *) echo "agent: unknown host \$host" >&2; exit 1 ;; esac
exec ip netns exec "\$ns" /bin/sh -c "\$*"
AGENT
chmod +x "$tmp/agent"

tx_bytes() { ip -n "$nsb" -s link show "${nsb}0" | awk '/TX:/{getline; print $1}'; }
mpi() {
    timeout -k 5 300 ip netns exec "$nsa" mpirun --allow-run-as-root --oversubscribe --host "$net.1,$net.2" -np 2 \
        --mca plm_rsh_agent "$tmp/agent" --mca btl self,tcp --mca btl_tcp_if_include "$net.0/24" \
        --mca oob_tcp_if_include "$net.0/24" "$@"
}

fail=0
before=$(tx_bytes)
mpi -x EMBER_TEST_DIST_MODE=coll -x EMBER_TEST_DATA="$PWD/tests/data" -x POCL_DEVICES=pthread \
    sh -c 'echo "rank $OMPI_COMM_WORLD_RANK in $(ip -brief addr | awk "/10.77/{print \$3}")"; exec "$0"' \
    "$build/test_dist" > "$tmp/coll.log" 2>&1 || true
after=$(tx_bytes)
grep -E "^rank [01] in|worst loss" "$tmp/coll.log" || true
for r in 0 1; do
    if ! grep -q "rank $r: PASS coll" "$tmp/coll.log"; then echo "FAIL: rank $r of the collectives/DDP checks"; fail=1; fi
done
grep -q "rank 1 in $net.2/24" "$tmp/coll.log" || { echo "FAIL: rank 1 did not run in the second namespace"; fail=1; }
sent=$(( after - before ))
echo "second namespace sent $sent bytes over its veth"
[ "$sent" -gt 100000 ] || { echo "FAIL: the ranks' traffic did not go over the veth pair"; fail=1; }
[ "$fail" = 0 ] || cat "$tmp/coll.log"

# all_reduce's own algorithms (direct exchange and ring, chosen by size) over TCP
if [ -x "$build/test_dist_allreduce" ]; then
    mpi -x EMBER_TEST_DIST_MODE=algo "$build/test_dist_allreduce" > "$tmp/algo.log" 2>&1 || true
    for r in 0 1; do
        if ! grep -q "rank $r: PASS algo" "$tmp/algo.log"; then echo "FAIL: rank $r of the all_reduce algorithm checks"; fail=1; fi
    done
    grep -q "rank 1: PASS algo" "$tmp/algo.log" && echo "all_reduce algorithms across the two namespaces: passed" || cat "$tmp/algo.log"
fi

# ember train with DDP across the two hosts
if mpi "$build/ember" train --device cpu --epochs 1 --train-samples 2000 --test-samples 500 \
       --checkpoint "$tmp/two.safetensors" > "$tmp/train.log" 2>&1 &&
   grep -q "DistributedDataParallel over 2 ranks" "$tmp/train.log" && grep -q "epoch 1/1: train loss" "$tmp/train.log"; then
    grep "epoch 1/1:" "$tmp/train.log"
else
    echo "FAIL: ember train across the two namespaces"; cat "$tmp/train.log"; fail=1
fi
[ "$fail" = 0 ] && echo "test_two_hosts: passed"
exit "$fail"
