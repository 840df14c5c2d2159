#!/usr/bin/env bash
# Packs, into the ignored folder .gpu/, what the bare GPU machine lacks for Ember's build and
# checks (scripts/gpu_check.sh; docs/GPU_CHECK.md). Run it here, where the Debian registry is:
#   .gpu/deps.tar.xz      a private prefix (usr/...) unpacked from Debian packages with
#                         dpkg-deb -x, never into /: OpenBLAS (pthread build) with its headers and
#                         its runtime (libgfortran5, libquadmath0), zlib's headers and library;
#                         oneDNN (libdnnl2, libdnnl-dev: the CPU's bf16 matmul) with
#                         what libdnnl loads (libgomp1, ocl-icd-libopencl1).
#                         Compressed because OpenBLAS alone is 36 MB and libdnnl 40 MB (7 MB as
#                         xz); gpu_check.sh unpacks it.
#   .gpu/fashion-mnist/   the four IDX files of Debian's dataset-fashion-mnist (30 MB, gzip)
#   .gpu/kernel-cache/    every kernel program compiled by NVRTC as an sm_90 GPU (H100, H200)
#                         loads it (test_cuda_kernels_compile with EMBER_CUDA_PREWARM_SM=90,
#                         into an empty EMBER_CACHE_DIR; the CUBINs alone, about 6 MB), so the
#                         GPU check compiles no kernel when that machine's NVRTC is this one's
#                         version; another version misses the cache and compiles as usual.
#                         Skipped, with a note, where there is no NVRTC or build/.
#   .gpu/MANIFEST         package versions and file sizes
# The GPU machine receives the folder by carry=[".gpu"] (64 MiB at most: this script fails
# above 60 MiB). Usage: scripts/gpu_prepare.sh [dir]   (default .gpu)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
LIMIT_MIB=60
ARCH=$(dpkg --print-architecture)
TRIPLET=$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
# The OpenBLAS runtime and development files (the "-dev" metapackage would add alternatives
# only a package manager sets up), its Fortran runtime, zlib's development files.
PACKAGES=(libopenblas0-pthread libopenblas-pthread-dev libgfortran5 libquadmath0 zlib1g zlib1g-dev
          libdnnl2 libdnnl-dev libgomp1 ocl-icd-libopencl1)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/debs" "$work/root"
echo "gpu_prepare: downloading ${PACKAGES[*]} ($ARCH)"
# apt-get download writes into the current directory; the _apt sandbox user may not be able to
# write a mktemp folder, which only costs a warning
(cd "$work/debs" && apt-get download "${PACKAGES[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
for p in "${PACKAGES[@]}"; do
    ls "$work/debs/${p}_"*.deb >/dev/null 2>&1 || { echo "gpu_prepare: apt-get download $p failed (run apt-get update?)" >&2; exit 1; }
done
: >"$work/MANIFEST"
for deb in "$work"/debs/*.deb; do
    dpkg-deb -x "$deb" "$work/root"
    echo "package $(dpkg-deb -f "$deb" Package) $(dpkg-deb -f "$deb" Version)" >>"$work/MANIFEST"
done

# Keep only what the build links and runs with: everything goes under usr/ (zlib1g ships in
# /lib on Debian 12), static archives, LAPACK, the reference-BLAS names and docs go.
R=$work/root
LIBDIR=$R/usr/lib/$TRIPLET
if [ -d "$R/lib/$TRIPLET" ]; then
    mkdir -p "$LIBDIR"
    mv "$R/lib/$TRIPLET"/* "$LIBDIR/"
    rm -rf "${R:?}/lib"
fi
rm -rf "$R/usr/share"
find "$R" \( -name '*.a' -o -name 'liblapack.so*' -o -name 'libblas.so*' -o -name '*.pc' \) -exec rm -f {} +
find "$R" -xtype l -delete  # links into what was removed, or to absolute paths outside
# zlib1g-dev's libz.so points at /lib/...; point it at the copy beside it
zreal=$(cd "$LIBDIR" && ls libz.so.1.* | head -n1)
ln -sf "$zreal" "$LIBDIR/libz.so"
for need in "usr/include/zlib.h" "usr/include/$TRIPLET/openblas-pthread/cblas.h" \
            "usr/lib/$TRIPLET/openblas-pthread/libopenblas.so" "usr/lib/$TRIPLET/openblas-pthread/libopenblas.so.0" \
            "usr/lib/$TRIPLET/libgfortran.so.5" "usr/lib/$TRIPLET/libz.so" \
            "usr/include/dnnl.h" "usr/lib/$TRIPLET/libdnnl.so" "usr/lib/$TRIPLET/libdnnl.so.2"; do
    [ -e "$R/$need" ] || { echo "gpu_prepare: $need missing after unpacking" >&2; exit 1; }
done

rm -rf "$DIR"
mkdir -p "$DIR/fashion-mnist"
echo "gpu_prepare: compressing the prefix ($(du -sh "$R" | cut -f1) unpacked)"
tar -C "$R" -cf - usr | xz -6 -T2 >"$DIR/deps.tar.xz"

# Fashion-MNIST: from the installed package (scripts/setup.sh installs it), else downloaded
FM=$(dpkg -L dataset-fashion-mnist 2>/dev/null | grep -m1 '/train-images-idx3-ubyte.gz$' || true)
if [ -z "$FM" ]; then
    (cd "$work/debs" && apt-get download dataset-fashion-mnist 2>&1 | grep -v "^W: " || true)
    mkdir -p "$work/fm" && dpkg-deb -x "$work"/debs/dataset-fashion-mnist_*.deb "$work/fm"
    FM=$(find "$work/fm" -name train-images-idx3-ubyte.gz | head -n1)
fi
FMDIR=$(dirname "$FM")
for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    cp "$FMDIR/$f.gz" "$DIR/fashion-mnist/"
done
echo "data fashion-mnist from $FMDIR" >>"$work/MANIFEST"

# The kernel cache for compute capability 9.0, from the build's test program
BUILD=${EMBER_BUILD_DIR:-build}
if [ -f "$BUILD/CMakeCache.txt" ] && cmake --build "$BUILD" --target test_cuda_kernels_compile >/dev/null 2>&1; then
    mkdir -p "$work/kc" "$DIR/kernel-cache"
    if (cd "$(dirname "$0")/.." && EMBER_CACHE_DIR="$work/kc" EMBER_CUDA_PREWARM_SM=90 "$BUILD/test_cuda_kernels_compile" \
        >"$work/kc.log" 2>&1); then
        cp "$work"/kc/*.cubin "$DIR/kernel-cache/"
        echo "kernel-cache $(grep -m1 'programs cached' "$work/kc.log" | sed 's/^ *//')" >>"$work/MANIFEST"
    else
        echo "gpu_prepare: no kernel cache: test_cuda_kernels_compile failed ($(tail -n1 "$work/kc.log"))" >&2
        rmdir "$DIR/kernel-cache"
    fi
else
    echo "gpu_prepare: no kernel cache: no build of test_cuda_kernels_compile in $BUILD" >&2
fi
(cd "$DIR" && find . -type f ! -name MANIFEST -printf '%s %p\n' | sort -k2) >>"$work/MANIFEST"
cp "$work/MANIFEST" "$DIR/MANIFEST"

bytes=$(du -sb "$DIR" | cut -f1)
mib=$((bytes / 1048576))
echo "gpu_prepare: $DIR holds $bytes bytes ($mib MiB; the carry limit is 64 MiB):"
sed 's/^/  /' "$DIR/MANIFEST"
if [ "$mib" -ge "$LIMIT_MIB" ]; then
    echo "gpu_prepare: $DIR is over $LIMIT_MIB MiB: too close to the 64 MiB carry limit" >&2
    exit 1
fi
echo "gpu_prepare: done. On the GPU machine: scripts/gpu_check.sh \$OUT (carry .gpu)"
