# Sourced first in a command on the device machine (bash): installs the carried wheels, sets the
# environment every GPU script here expects, and restores the compiled Triton kernels (and autotuning
# results) carried from an earlier run, so a fresh machine does not compile them again.
#
#   run(carry=[".whl", ".traces", ".tcache.tar.xz"]):
#     source benchmarks/gpu/device_env.sh && ...; save_triton_cache
#   back here: cat <files_at>/tcache.tar.xz.* > .tcache.tar.xz    # the next run carries it
#
# Only the kernels' binaries and metadata are kept (Triton finds a kernel by those; its IR text is
# dropped) and xz packs it (~11 MB for ~2,600 kernels), so the archive stays within the carry limit. It comes back in parts of at most 15 MiB (a file
# from $OUT may not exceed 16 MiB). A stale archive costs nothing: kernels whose source changed miss and
# compile as before.

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || return 1
export PYTHONPATH="/tmp/site:$PWD" FLASHSTATE_HOME=/tmp/fs PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR="$PWD/.tcache"
if [ -f .tcache.tar.xz ]; then
  tar -xJf .tcache.tar.xz && echo "device_env: $(find .tcache -name '*.cubin' | wc -l) Triton kernels restored"
fi

save_triton_cache() {
  [ -d .tcache ] || return 0
  (cd .tcache && find . -type f \( -name '*.cubin' -o -name '*.json' \) -print0 \
    | tar --null -c --transform 's,^\./,.tcache/,' -T - | xz -6 -T0 | split -b 15M -d -a 2 - "${OUT:-.}/tcache.tar.xz.")
  echo "device_env: $(cat "${OUT:-.}"/tcache.tar.xz.* | wc -c) bytes of Triton cache in \$OUT/tcache.tar.xz.*"
}
