# Sourced first in a command on the device machine (bash): installs the carried wheels, sets the
# environment every GPU script here expects, and restores the compiled Triton kernels (and autotuning
# results) carried from an earlier run, so a fresh machine does not compile them again.
#
#   run(carry=[".whl", ".traces", ".tcache.tar.xz"]):
#     source benchmarks/gpu/device_env.sh && ...; save_triton_cache
#   back here: cat <files_at>/tcache.tar.xz.* > .tcache.tar.xz    # the next run carries it
#
# The wheels the device image lacks (what flashstate serve and the GPU kernels need; 7.5 MB), fetched here:
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     $(for n in 17 24 27 28 31 34 35; do echo --platform manylinux_2_${n}_x86_64; done) \
#     --platform manylinux2014_x86_64 -d .whl fastapi starlette uvicorn pydantic pydantic-core annotated-types \
#     typing-inspection typing-extensions opentelemetry-api importlib-metadata lazy-importer \
#     'llguidance>=1.9.1,<2' isal fla-core==0.6.0 flash-linear-attention==0.6.0
# (check that pydantic's pinned pydantic-core is the one fetched; keep one version of each).
#
# Only the kernels' binaries and metadata are kept (Triton finds a kernel by those; its IR text is
# dropped) and xz packs it (~11 MB for ~2,600 kernels), so the archive stays within the carry limit. It comes back in parts of at most 15 MiB (a file
# from $OUT may not exceed 16 MiB). A stale archive costs nothing: kernels whose source changed miss and
# compile as before.

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl || return 1
# Binary packages too large for the carry limit as wheels travel as .tar.xz of their installed files
# (mooncake-slim: the store client, mooncake_master and libibverbs; vllm-router: the fleet's router).
for bundle in .whl/*.tar.xz; do
  [ -f "$bundle" ] && tar -xJf "$bundle" -C /tmp/site
done
if [ -d /tmp/site/vllm_router ] && [ ! -x /tmp/site/bin/vllm-router ]; then
  mkdir -p /tmp/site/bin
  printf '#!/usr/bin/env python3\nimport sys\nfrom vllm_router.launch_router import main\nsys.exit(main())\n' \
    > /tmp/site/bin/vllm-router && chmod +x /tmp/site/bin/vllm-router
fi
export PATH="/tmp/site/bin:/tmp/site/mooncake:$PATH" LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/tmp/site/syslibs"
export PYTHONPATH="/tmp/site:$PWD" FLASHSTATE_HOME=/tmp/fs PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# TRITON_CACHE_DIR may name a folder outside the tree, so that a warm machine keeps it between calls.
export TRITON_CACHE_AUTOTUNING=1 TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.tcache}"
if [ -f .tcache.tar.xz ]; then
  mkdir -p "$TRITON_CACHE_DIR" && tar -xJf .tcache.tar.xz -C "$TRITON_CACHE_DIR" --strip-components=1 && echo "device_env: $(find "$TRITON_CACHE_DIR" -name '*.cubin' | wc -l) Triton kernels restored"
fi

save_triton_cache() {
  [ -d "$TRITON_CACHE_DIR" ] || return 0
  (cd "$TRITON_CACHE_DIR" && find . -type f \( -name '*.cubin' -o -name '*.json' \) -print0 \
    | tar --null -c --transform 's,^\./,.tcache/,' -T - | xz -6 -T0 | split -b 15M -d -a 2 - "${OUT:-.}/tcache.tar.xz.")
  echo "device_env: $(cat "${OUT:-.}"/tcache.tar.xz.* | wc -c) bytes of Triton cache in \$OUT/tcache.tar.xz.*"
}
