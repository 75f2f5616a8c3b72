#!/usr/bin/env bash
# On the GPU machine (no network), from the repo root with .device/ carried (tools/prepare_device.sh):
#   tools/gpu_run.sh setup      wheels -> /tmp/site, libggml_ciq (CUDA) -> /tmp/ciq-build, and llama.cpp CUDA
#                               (llama-cpp-python sdist, sm_90) built in the background -> /tmp/llama
#   tools/gpu_run.sh test       GPU test suite (pytest tests/test_cuda.py + the rest)
#   tools/gpu_run.sh sanitize   compute-sanitizer memcheck + racecheck on every kernel -> $OUT
#   tools/gpu_run.sh wait       wait for the llama.cpp CUDA build
#   tools/gpu_run.sh py ARGS    python3 ARGS with this environment (e.g. py -m ggml_ciq.cli bench gemm ...)
#   tools/gpu_run.sh all        setup, test, sanitize, wait, llama.cpp-CUDA tests and diffs; logs under $OUT
#   tools/gpu_run.sh stage      keep the carried .device-parts/* in /tmp/parts; once all are there, join them into
#                               /tmp/gemma3-270m.gguf (checked against SHA256SUMS): the whole Gemma file for `compare`
#   tools/gpu_run.sh compare    engine vs llama.cpp CUDA: Gemma 3 270M at 512 tokens, synthetic Llama-3-8B at 512 and
#                               2048 -> $OUT (needs stage, wait)
#   tools/gpu_run.sh bench      bench/results/h200 set (llama3-8b n=512/2048, seed6) as JSON under $OUT (plot them
#                               here with `ggml-ciq bench plot`: the machine's matplotlib fails to import)
# /tmp survives between calls while the machine stays warm, so setup runs once per lease.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD:/tmp/llama PYTHONUNBUFFERED=1
export GGML_CIQ_LIB=/tmp/ciq-build/libggml_ciq.so GGML_CIQ_LLAMACPP_LIB=/tmp/llama/llama_cpp/lib
DEV=/tmp/device  # setup's copy of the carried .device/: later calls need not carry it
export GGML_CIQ_GEMMA3_270M=$DEV/gemma3-270m-kquants.gguf GGML_CIQ_CACHE=/tmp/ciq-cache
export GGML_CIQ_LLAMA3_VOCAB=$DEV/ggml-vocab-llama-bpe.gguf
[ -f $DEV/LLAMACPP_COMMIT ] && export GGML_CIQ_LLAMACPP_COMMIT=$(cat $DEV/LLAMACPP_COMMIT)
[ -f /tmp/gemma3-270m.gguf ] && export GGML_CIQ_GEMMA3_270M=/tmp/gemma3-270m.gguf  # the whole file, once staged
ARCHS=${GGML_CIQ_CUDA_ARCHITECTURES:-90a}

setup() {
  [ -d .device ] && rm -rf $DEV && cp -r .device $DEV
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $DEV/whl/*.whl
  cmake -S native -B /tmp/ciq-build -G Ninja -DGGML_CIQ_CUDA=ON -DGGML_CIQ_CUDA_ARCHITECTURES="$ARCHS" > /tmp/ciq-cmake.log \
    && ninja -C /tmp/ciq-build 2>&1 | tail -n 3 || { cat /tmp/ciq-cmake.log; return 1; }
  if [ -z "${NO_LLAMA:-}" ] && [ ! -f /tmp/llama/llama_cpp/lib/libggml-cuda.so ] && [ ! -f /tmp/llama.building ]; then
    touch /tmp/llama.building
    tar xzf $DEV/llama_cpp_python.tar.gz -C /tmp
    setsid bash -c 'CMAKE_ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF" \
      CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip wheel --no-build-isolation --no-deps --no-index -w /tmp/w \
      /tmp/llama_cpp_python-0.3.36 > /tmp/llama-build.log 2>&1 && mkdir -p /tmp/llama && cd /tmp/llama && \
      python3 -m zipfile -e /tmp/w/llama_cpp_python-*.whl . ; rm -f /tmp/llama.building' < /dev/null &
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
}

case "${1:-}" in
  setup) setup ;;
  test) shift; python3 -m pytest -q -rs -p no:cacheprovider "$@" ;;
  stage)
    mkdir -p /tmp/parts && cp .device-parts/* /tmp/parts/ 2>/dev/null
    if (cd /tmp/parts && grep part SHA256SUMS | sha256sum --quiet -c - 2>/dev/null); then
      cat /tmp/parts/gemma3-270m.gguf.part* > /tmp/gemma3-270m.gguf.tmp
      (cd /tmp && grep -v part /tmp/parts/SHA256SUMS | sed 's|gemma3-270m.gguf|gemma3-270m.gguf.tmp|' | sha256sum -c -) \
        && mv /tmp/gemma3-270m.gguf.tmp /tmp/gemma3-270m.gguf
    fi
    ls -la /tmp/parts /tmp/gemma3-270m.gguf 2>&1 | tail -n 8 ;;
  compare)  # issue 7's H200 runs: Gemma agreement at 512 tokens; the synthetic Llama-3-8B (written on first use from
            # the carried vocab GGUF) at 512 and 2048 tokens
    python3 -m ggml_ciq.cli compare gemma3-270m --tokens 512 --device cuda --repeat 5 --json "$OUT/compare-gemma3-270m-512.json" \
      2>&1 | tail -n 20
    for n in 512 2048; do
      python3 -m ggml_ciq.cli compare llama3-8b-synthetic --tokens $n --device cuda --repeat 5 \
        --json "$OUT/prefill-llama3-8b-synthetic-n$n.json" 2>&1 | tail -n 20
    done ;;
  sanitize)
    shift
    for tool in memcheck racecheck; do
      compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py "$@" > "$OUT/sanitizer-$tool.txt" 2>&1
      echo "$tool exit=$? $(tail -n 1 "$OUT/sanitizer-$tool.txt")"
    done ;;
  wait) while [ -f /tmp/llama.building ]; do sleep 5; done; tail -n 2 /tmp/llama-build.log; ls /tmp/llama/llama_cpp/lib ;;
  py) shift; python3 "$@" ;;
  all)
    "$0" setup 2>&1 | tail -n 8
    "$0" test tests/test_cuda.py tests/test_native.py tests/test_ops.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -n 15
    "$0" sanitize
    "$0" wait 2>&1 | tail -n 3
    "$0" test tests/test_cuda.py tests/test_compare.py tests/test_layer_diff.py -k "llamacpp or cuda or gpu" 2>&1 \
      | tee "$OUT/pytest-llamacpp-cuda.txt" | tail -n 8
    for model in default gemma3-270m; do
      python3 -m ggml_ciq.cli diff $model --backend ciq-cuda --reference llamacpp-cuda --variant mma --tokens 131 \
        --json "$OUT/diff-$model-mma-vs-llamacpp-cuda.json" 2>&1 | tail -n 2
    done
    ;;
  bench)  # the committed result set: Llama-3-8B shapes at 512 and 2048 tokens, seed6 at 128
    for spec in "llama3-8b 512 llama3-8b-n512" "llama3-8b 2048 llama3-8b-n2048" "seed6 128 seed6"; do
      set -- $spec
      python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes $1 --tokens $2 --repeat ${REPEAT:-5} --variants ${VARIANTS:-mma,wgmma} \
        --json "$OUT/$3.json" 2>&1 | tail -n 16
    done ;;
  *) echo "usage: tools/gpu_run.sh setup|test|sanitize|wait|py|all|bench|stage|compare" >&2; exit 2 ;;
esac
