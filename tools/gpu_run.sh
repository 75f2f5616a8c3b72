#!/usr/bin/env bash
# On the GPU machine (no network), from the repo root with .device/ carried (tools/prepare_device.sh):
#   tools/gpu_run.sh setup      wheels -> /tmp/site, libggml_ciq (CUDA) and the ggml plugin libggml-ciq -> /tmp/ciq-build,
#                               and llama.cpp CUDA (CMake on the carried sdist, sm_90, shared libs; libllama,
#                               test-backend-ops, llama-bench, llama-perplexity) built in the background -> /tmp/llama-cuda;
#                               /tmp/llama/llama_cpp is the sdist's Python package with lib/ -> that build
#                               (GGML_CIQ_LLAMACPP_LIB: the Python bridge uses the same libraries as the tools)
#   tools/gpu_run.sh test       GPU test suite (pytest tests/test_cuda.py + the rest)
#   tools/gpu_run.sh sanitize [CASE]  compute-sanitizer memcheck + racecheck on every kernel, or one of
#                               tools/sanitize_case.py's cases (engine, attention-split, attention-wgmma, ops, fusion,
#                               wgmma-block32, wgmma-stream-k, wgmma-rs, wgmma-group-glu, a variant) -> $OUT
#   tools/gpu_run.sh wait       wait for the llama.cpp CUDA build
#   tools/gpu_run.sh py ARGS    python3 ARGS with this environment (e.g. py -m ggml_ciq.cli bench gemm ...)
#   tools/gpu_run.sh pack NAME  everything under $OUT into $OUT/NAME.tgz (a call returns at most 8 files)
#   tools/gpu_run.sh bench-attention  our attention kernels vs llama.cpp's FLASH_ATTN_EXT, Gemma and 8B cases (wait)
#   tools/gpu_run.sh fuse-ab    GGML_CIQ_FUSE x GGML_CIQ_WGMMA_TAIL on our 8B (TOKENS) and Gemma 512 prefills (graphs)
#   tools/gpu_run.sh attention-ab  AUTO's attention wgmma vs mma (GGML_CIQ_ATTENTION_WGMMA) on our 8B (TOKENS) and Gemma prefills
#   tools/gpu_run.sh tail-ab    the tail split on/off in bench gemm (8B shapes, 512 tokens)
#   tools/gpu_run.sh streamk-ab wgmma's stream-K on/off in bench gemm (8B shapes at 512 and 2048 tokens, seed6)
#   tools/gpu_run.sh rs-ab      wgmma's RS form (A from registers) against SS, and RS on 128-token tiles (8B at 512, seed6)
#   tools/gpu_run.sh baseline | lib-ab  an earlier commit's library (carried .baseline/) built, then bench gemm with it and
#                               with this tree's alternately (seed6 by default; host_us: the calls' host time)
#   tools/gpu_run.sh gemm-diag  wgmma with its dequantization or its wgmma left out (CIQ_WGMMA_DIAG builds): which side
#                               bounds the GEMM; gemm-ncu: Nsight Compute on one launch of each (what the consumers wait on)
#   tools/gpu_run.sh split-ab | ops-timing | output-row   the attention split's A/B (Gemma, the 8B); the elementwise ops
#                               old vs new; Gemma's output row at 1 and 8 tokens against llama.cpp's MMVQ
#   tools/gpu_run.sh bench-pdl | offload-sweep | memory   wgmma PDL A/B; wgmma vs llama.cpp at 16..128 tokens (the
#                               offload thresholds, TOKENS="..." to choose); device memory under repetition
#   tools/gpu_run.sh all        setup, test, sanitize, wait, llama.cpp-CUDA tests and diffs; logs under $OUT
#   tools/gpu_run.sh stage      keep the carried .device-parts/* in /tmp/parts; once all are there, join them into
#                               /tmp/gemma3-270m.gguf (checked against SHA256SUMS): the whole Gemma file for `compare`
#   tools/gpu_run.sh attention-diff  mma_llamacpp vs llama.cpp's flash attention on its captured inputs (needs stage, wait)
#   tools/gpu_run.sh ops-vs-llamacpp  our llama.cpp-order ops vs llama.cpp CUDA's; our GEMMs vs MMQ split / unsplit (wait)
#   tools/gpu_run.sh diff-prompt  GEMMs on llama.cpp CUDA's captured Gemma activations, hidden state per layer (stage, wait)
#   tools/gpu_run.sh layer-trace  per layer and op: where ours (llamacpp semantics) first differs from llama.cpp CUDA (stage, wait)
#   tools/gpu_run.sh kernel-profile  issue 16: a Gemma prefill (CUDA graphs) kernel by kernel under ncu (stage)
#   tools/gpu_run.sh graph-bench  issue 16: our Gemma prefill eager vs CUDA graphs at 512 and 4096 tokens (stage)
#   tools/gpu_run.sh compare    engine vs llama.cpp CUDA and the float64 reference: Gemma 3 270M at 512 and 4096
#                               tokens; synthetic Llama-3-8B at 512 and 2048 (speed) -> $OUT (needs stage, wait)
#   tools/gpu_run.sh bench      the `bench gemm` set (llama3-8b n=512/2048, seed6) as JSON under $OUT (plot them
#                               here with `ggml-ciq bench plot`: the machine's matplotlib fails to import)
# The ggml plugin (issue 15, docs/PLUGIN.md; after setup + wait; the Gemma steps after stage):
#   tools/gpu_run.sh plugin-check   `ggml-ciq info`, pytest tests/test_plugin.py (its GPU test), test-backend-ops
#                                   -b CIQ0 -o MUL_MAT in mode test (GGML_CIQ_OFFLOAD=all: every shape our kernels run;
#                                   and the default: what the plugin takes) -> $OUT/plugin/
#   tools/gpu_run.sh plugin-perf    test-backend-ops perf -o MUL_MAT on CIQ0 and on CUDA0 (same binary) -> $OUT/plugin/
#   tools/gpu_run.sh plugin-bench   llama-bench -o json, -dev CUDA0 vs -dev CIQ0/CUDA0 -ts 0/1 in one run, pp512,
#                                   pp2048, tg128 (the 8B also pp16..128), FA=1 (FA=0,1 both), REPS=5: Gemma 3 270M and
#                                   the synthetic Llama-3-8B; Gemma all-offloaded, the 8B none; pp512/tg128 in both
#                                   device orders, 10 repetitions -> $OUT/plugin/ (13 files: end the call with pack)
#   tools/gpu_run.sh plugin-kld     llama-perplexity --kl-divergence on Gemma over the carried text: plugin vs CUDA0
#                                   (fa off, fa on) and CUDA0 fa on vs off (the yardstick) -> $OUT/plugin/
#   tools/gpu_run.sh plugin-splits  GGML_SCHED_DEBUG splits of a Gemma prefill, CIQ0/CUDA0 and CUDA0 alone -> $OUT
#   tools/gpu_run.sh breakdown      engine prefill of Gemma at 512 and 4096 tokens, time by op class -> $OUT
#   tools/gpu_run.sh plugin-sanitize  compute-sanitizer memcheck on a whole llama.cpp prefill (llama-bench, 77 tokens,
#                                   Gemma) through the plugin -> $OUT/plugin/
# Every plugin step logs what it runs; a failing step does not stop the next one.
#
# A lease (~25 device-minutes; every call starts with `export GGML_CIQ_COMMIT=<sha>;`, and fires as soon as the last
# returns: the machine goes back ~30 s after a call; a call carries at most 64 MiB with the tracked tree). A call blocks
# the caller until it ends, so a `sleep` in one holds the machine but not time to edit: make edits between leases, or
# beside a call only when they take seconds (the eleventh session lost its llama.cpp build and staged model that way):
#   call 1, carry .device: setup (llama.cpp builds in the background, ~5 min; keep the CPU free meanwhile) ; GPU tests
#           that need no llama.cpp (test tests/test_ops.py tests/test_engine.py ...)
#   then one call carrying .device-extra (the 8B's vocabulary, which does not fit beside .device in call 1): `stage`;
#   11 calls, each carrying one .device-parts/gemma3-270m.gguf.partNN + .device-parts/SHA256SUMS: `stage` (~5 s each;
#           the last joins and checks the whole file; 24 MiB parts since the tree passed 33 MB)
#   then: wait ; test tests/test_cuda.py tests/test_plugin.py ; plugin-check ; plugin-bench ; memory ; compare ; and
#           end every call that writes more than 8 files under $OUT with `pack NAME` (a call returns at most 8 files,
#           named in letters, digits, '.', '_' and '-')
# API v14 (the GLU from gate/up's epilogue, q+k beside v in one launch) measured at f56790f (issue16-f56790f); API v15
# (RoPE + K/V stores in q/k/v's epilogue, 474f736) measured and reverted (issue16-474f736). lib-ab against a library of
# an older API: BASELINE=COMMIT BASELINE_ONLY=1 tools/prepare_device.sh (writes this tree's API version into it). Tags:
# A/B arms of compare-8b take TAG=NAME (their JSON names); never point OUT at a folder of its own (`run` brings back
# only what lies under its $OUT: the fourteenth session lost a breakdown so). setup replaces /tmp/device with the
# carried .device, so `stage` .device-extra after it. The tracked tree is 33.1 MB: beside .device (33.0 MB) the setup
# call has ~1 MB of its 64 MiB left; commit results small (gzip, no plots) or shrink .device first. A NO_LLAMA=1 setup
# (lib-ab, our tests) needs only .device/whl, .device/llama_cpp_python.tar.gz and .device/LLAMACPP_COMMIT in carry.
# Issue 16's bars were all met at 4a93705 (results-archive-1:bench/results/h200/issue16-4a93705). On the GPU machine next: the CPU
# last-token test with the whole Gemma staged (`test tests/test_engine.py -k last_token`: llama.cpp CPU gets no GPU
# device since 84f493d; it failed before, passing with CUDA_VISIBLE_DEVICES=). Prepare every edit before the lease:
# the machine goes back 30 s after a call, with /tmp.
# Also not rerun since ac2ab62's change to the plugin's waits: plugin-sanitize. Run one-off scripts as
# `gpu_run.sh py tools/X.py` (its PYTHONPATH), and fire the next call within 30 s.
# /tmp survives between calls while the machine stays warm, so setup runs once per lease.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD:/tmp/llama PYTHONUNBUFFERED=1
export GGML_CIQ_LIB=/tmp/ciq-build/libggml_ciq.so GGML_CIQ_LLAMACPP_LIB=/tmp/llama/llama_cpp/lib
SDIST=/tmp/llama_cpp_python-0.3.36 LLAMA_BUILD=/tmp/llama-cuda PLUGIN=/tmp/ciq-build/libggml-ciq.so
export GGML_CIQ_LLAMACPP_SRC=$SDIST GGML_CIQ_PLUGIN=$PLUGIN  # the plugin's headers; the plugin the tests load
DEV=/tmp/device  # setup's copy of the carried .device/: later calls need not carry it
export GGML_CIQ_GEMMA3_270M=$DEV/gemma3-270m-kquants.gguf GGML_CIQ_CACHE=/tmp/ciq-cache
export GGML_CIQ_LLAMA3_VOCAB=$DEV/ggml-vocab-llama-bpe.gguf
[ -f $DEV/LLAMACPP_COMMIT ] && export GGML_CIQ_LLAMACPP_COMMIT=$(cat $DEV/LLAMACPP_COMMIT)
[ -f /tmp/gemma3-270m.gguf ] && export GGML_CIQ_GEMMA3_270M=/tmp/gemma3-270m.gguf  # the whole file, once staged
ARCHS=${GGML_CIQ_CUDA_ARCHITECTURES:-90a}
# Our commit for the result files (environment.ciq_commit): setup's GGML_CIQ_COMMIT, kept for the lease's later calls
# (each call is a new shell; the tree's git metadata there is not this checkout's).
if [ -n "${GGML_CIQ_COMMIT:-}" ]; then echo "$GGML_CIQ_COMMIT" > /tmp/ciq-commit
elif [ -f /tmp/ciq-commit ]; then export GGML_CIQ_COMMIT=$(cat /tmp/ciq-commit); fi

setup() {
  [ -d .device ] && rm -rf $DEV && cp -r .device $DEV
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $DEV/whl/*.whl
  [ -d $SDIST ] || tar xzf $DEV/llama_cpp_python.tar.gz -C /tmp
  cmake -S native -B /tmp/ciq-build -G Ninja -DGGML_CIQ_CUDA=ON -DGGML_CIQ_CUDA_ARCHITECTURES="$ARCHS" > /tmp/ciq-cmake.log \
    && ninja -C /tmp/ciq-build 2>&1 | tail -n 3 || { cat /tmp/ciq-cmake.log; return 1; }
  grep "ggml_ciq plugin" /tmp/ciq-cmake.log
  if [ -z "${NO_LLAMA:-}" ] && [ ! -f $LLAMA_BUILD/bin/libggml-cuda.so ] && [ ! -f /tmp/llama.building ]; then
    touch /tmp/llama.building
    # CMake directly on the sdist's llama.cpp: the tools and test-backend-ops too, and shared libraries that the
    # Python bridge loads as well (no second, pip-wheel build of the same code).
    setsid bash -c "cmake -S $SDIST/vendor/llama.cpp -B $LLAMA_BUILD -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=ON -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=OFF -DLLAMA_OPENSSL=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF > /tmp/llama-build.log 2>&1 && \
      ninja -C $LLAMA_BUILD -j 16 llama test-backend-ops llama-bench llama-perplexity >> /tmp/llama-build.log 2>&1 && \
      mkdir -p /tmp/llama && rm -rf /tmp/llama/llama_cpp && cp -r $SDIST/llama_cpp /tmp/llama/ && \
      ln -s $LLAMA_BUILD/bin /tmp/llama/llama_cpp/lib; rm -f /tmp/llama.building" < /dev/null > /dev/null 2>&1 &
  fi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
}

# step NAME TIMEOUT CMD...: runs CMD with a time limit, its output into $OUT/plugin/NAME.txt, and one status line.
step() {
  local name=$1 limit=$2; shift 2
  mkdir -p "$OUT/plugin"
  echo "== $name: $*" | tee "$OUT/plugin/$name.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" >> "$OUT/plugin/$name.txt" 2>&1
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/plugin/$name.txt"
  tail -n 4 "$OUT/plugin/$name.txt" | head -n 3
  return 0
}

# step_json NAME TIMEOUT CMD...: the same, with CMD's stdout (llama-bench -o json) alone in $OUT/plugin/NAME.json.
step_json() {
  local name=$1 limit=$2; shift 2
  mkdir -p "$OUT/plugin"
  echo "== $name: $*" | tee "$OUT/plugin/$name.txt"
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/plugin/$name.json" 2>> "$OUT/plugin/$name.txt"
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$OUT/plugin/$name.txt"
  grep -o '"test_time": "[^"]*"\|"n_prompt": [0-9]*\|"n_gen": [0-9]*\|"avg_ts": [0-9.]*' "$OUT/plugin/$name.json" | paste -sd' ' | head -c 1500; echo
  return 0
}

# The environment of the plugin's result files: device and clocks, both commits, the plugin's build info.
plugin_environment() {
  mkdir -p "$OUT/plugin"
  python3 -c "import json; from ggml_ciq import environment, plugin; d = environment.describe(); \
d['plugin'] = plugin.build_info('$PLUGIN'); print(json.dumps(d, indent=1))" > "$OUT/plugin/environment.json" 2>&1
}

# diag_lib N: the library built with CIQ_WGMMA_DIAG=N (gemm_wgmma.cu's measurement builds) in /tmp/ciq-diagN, once.
diag_lib() {
  [ -f /tmp/ciq-diag$1/libggml_ciq.so ] && return 0
  cmake -S native -B /tmp/ciq-diag$1 -G Ninja -DGGML_CIQ_CUDA=ON -DGGML_CIQ_CUDA_ARCHITECTURES="$ARCHS" \
    -DGGML_CIQ_PLUGIN=OFF -DCMAKE_CUDA_FLAGS=-DCIQ_WGMMA_DIAG=$1 > /dev/null \
    && ninja -C /tmp/ciq-diag$1 > /tmp/ciq-diag$1.log 2>&1 || { tail -n 5 /tmp/ciq-diag$1.log; return 1; }
}

gemma_path() { [ -f /tmp/gemma3-270m.gguf ] && echo /tmp/gemma3-270m.gguf || { echo "no /tmp/gemma3-270m.gguf: run stage first" >&2; return 1; }; }

case "${1:-}" in
  setup) setup ;;
  test) shift; python3 -m pytest -q -rs -p no:cacheprovider "$@" ;;
  stage)
    [ -d .device-extra ] && mkdir -p $DEV && cp .device-extra/* $DEV/  # the 8B's vocabulary (prepare_device.sh)
    mkdir -p /tmp/parts && cp .device-parts/* /tmp/parts/ 2>/dev/null
    if (cd /tmp/parts && grep part SHA256SUMS | sha256sum --quiet -c - 2>/dev/null); then
      cat /tmp/parts/gemma3-270m.gguf.part* > /tmp/gemma3-270m.gguf.tmp
      (cd /tmp && grep -v part /tmp/parts/SHA256SUMS | sed 's|gemma3-270m.gguf|gemma3-270m.gguf.tmp|' | sha256sum -c -) \
        && mv /tmp/gemma3-270m.gguf.tmp /tmp/gemma3-270m.gguf
    fi
    ls -la /tmp/parts /tmp/gemma3-270m.gguf 2>&1 | tail -n 8 ;;
  compare)  # issue 18's H200 runs: Gemma 3 270M at 512 and 4096 tokens, every arm (llama.cpp FA on and its FA-off
            # spread, ours llamacpp, exact and fast, the float64 reference on the host CPU) and, with the plugin built,
            # the plugin arm with every weight MUL_MAT offloaded (GGML_CIQ_OFFLOAD=all: the table takes none of Gemma's)
            # GRAPH=1: our arms as CUDA graphs; REFERENCE=off: no float64 arm (speed runs: 4096 tokens fit a call)
    plugin=; [ -f $LLAMA_BUILD/bin/libggml-cuda.so ] && [ -f $PLUGIN ] && plugin=--plugin
    for n in ${TOKENS:-512 4096}; do
      GGML_CIQ_OFFLOAD=all timeout ${LIMIT:-280} python3 -m ggml_ciq.cli compare "$(gemma_path)" --tokens $n --device cuda \
        --repeat 5 $plugin ${GRAPH:+--cuda-graph} ${REFERENCE:+--reference $REFERENCE} --json "$OUT/compare-gemma3-270m-$n${GRAPH:+-graph}.json" \
        --plot "$OUT/compare-gemma3-270m-$n${GRAPH:+-graph}.png" 2>&1 \
        | tail -n 40
    done ;;
  attention-diff)  # issue 18: every FLASH_ATTN_EXT node of llama.cpp CUDA's Gemma prefill (512 and 4096 tokens) through
                   # mma_llamacpp on its own inputs, bit for bit, at 2 (llama.cpp's), 1 and 3 CTAs per SM
    timeout ${LIMIT:-300} python3 tools/attention_diff.py "$(gemma_path)" --tokens ${TOKENS:-512 4096} \
      --blocks-per-sm 2 1 3 --json "$OUT/attention-diff-gemma3-270m.json" --save "$OUT/attention-nodes" 2>&1 \
      | tail -n 20 ;;
  ops-vs-llamacpp)  # issue 18: our llama.cpp-order ops against llama.cpp CUDA's own (OpGraph, test_ops.py) and where
                    # our MMQ-semantics GEMMs part from MMQ (tools/mmq_seams.py: K split or not) -> $OUT
    python3 -m pytest -q -rs -p no:cacheprovider tests/test_ops.py -k "equal_llamacpp" 2>&1 | tail -n 25 \
      | tee "$OUT/pytest-gpu-ops-vs-llamacpp.txt"
    python3 tools/mmq_seams.py --json "$OUT/mmq-seams.json" 2>&1 | tail -n 20 ;;
  diff-prompt)  # issue 18: every GEMM on llama.cpp CUDA's captured activations of Gemma (the carried Vim text, 3000
                # bytes) through our kernel of its semantics, and our engine's hidden state after each layer against
                # llama.cpp's -> $OUT/diff-prompt-gemma3-270m-llamacpp-cuda.json (needs stage, wait)
    timeout ${LIMIT:-200} python3 -m ggml_ciq.cli diff "$(gemma_path)" --prompt "$(head -c 3000 $DEV/perplexity-text.txt)" \
      --reference llamacpp-cuda --json "$OUT/diff-prompt-gemma3-270m-llamacpp-cuda.json" 2>&1 | tail -n 30 ;;
  layer-trace)  # issue 18: which op of each layer first parts our engine (llamacpp semantics) from llama.cpp CUDA, bit
                # for bit: ours end to end, and each op of ours on llama.cpp's own captured inputs (tools/layer_trace.py)
    timeout ${LIMIT:-120} python3 tools/layer_trace.py "$(gemma_path)" --tokens ${TOKENS:-512} \
      --json "$OUT/layer-trace-gemma3-270m-${TOKENS:-512}.json" 2>&1 | grep -E "differs|sign of zero|first differing|every row" | head -n 40 ;;
  graph-bench)  # issue 16: the engine's prefill eager and as CUDA graphs (median of 5 after a warm-up; the same process
                # per pair of runs is not needed: ours against ours), Gemma 3 270M at 512 and 4096 tokens, fast and
                # llamacpp semantics -> $OUT/prefill-gemma3-270m-N-SEMANTICS[-graph].json (8 files)
    for n in 512 4096; do for s in fast llamacpp; do for g in "" --cuda-graph; do
      timeout 120 python3 -m ggml_ciq.cli prefill "$(gemma_path)" --tokens $n --device cuda --semantics $s --repeat 5 $g \
        --json "$OUT/prefill-gemma3-270m-$n-$s${g:+-graph}.json" 2>&1 | grep -E "tokens/s|rror" | head -n 2
    done; done; done ;;
  kernel-profile)  # issue 16: one engine prefill of Gemma 3 270M as CUDA graphs under Nsight Compute, each kernel
                   # timed alone (tools/kernel_profile.py), next to the prefill's wall time without ncu (median of 5):
                   # where the GPU time goes, and how long no kernel runs. SETS="512:fast 4096:fast 512:exact" by
                   # default -> $OUT/kernel-profile-gemma3-270m-N-S{.csv.gz,.json,-summary.txt,-prefill.json}
                   # MODEL=llama3-8b-synthetic profiles the synthetic 8B instead (files named for it)
    model=${MODEL:-$(gemma_path)} name=${MODEL:-gemma3-270m}
    for set in ${SETS:-512:fast 4096:fast 512:exact}; do
      n=${set%%:*} s=${set##*:} f="$OUT/kernel-profile-$name-$n-$s"
      timeout 120 python3 -m ggml_ciq.cli prefill "$model" --tokens $n --device cuda --semantics $s --repeat 5 \
        --cuda-graph --json "$f-prefill.json" 2>&1 | grep -E "tokens/s|rror" | head -n 2
      wall=$(python3 -c "import json, statistics; print(1e3 * statistics.median(json.load(open('$f-prefill.json'))['runs_seconds']))")
      timeout ${LIMIT:-200} ncu --profile-from-start off --clock-control none --metrics gpu__time_duration.sum --csv \
        --log-file "$f.csv" python3 tools/kernel_profile.py run "$model" --tokens $n --semantics $s --cuda-graph \
        > "$f.txt" 2>&1
      echo "$set: ncu exit $?, wall $wall ms"
      python3 tools/kernel_profile.py summarize "$f.csv" --wall-ms "$wall" --json "$f.json" > "$f-summary.txt" 2>&1
      head -n 14 "$f-summary.txt"
      gzip -f "$f.csv"
    done ;;
  sass)  # a kernel's SASS from llama.cpp's CUDA build (after wait), e.g. `sass rms_norm_mul_rope_f32ILi256ELb0Ef`: how
         # nvcc contracted it (the issue 18 finding, docs/SEMANTICS.md); cuobjdump over the whole library takes ~2 min
    timeout ${LIMIT:-300} cuobjdump -sass $LLAMA_BUILD/bin/libggml-cuda.so 2>/dev/null | awk -v f="${2:?kernel name}" \
      '$0 ~ "Function : .*"f {p=1} /Function :/ && $0 !~ f {p=0} p' | gzip > "$OUT/sass-llamacpp-$2.txt.gz"
    ls -la "$OUT/sass-llamacpp-$2.txt.gz" ;;
  compare-8b)  # speed only (no reference: 64 GB in float64): the synthetic Llama-3-8B at TOKENS (512 2048), GRAPH=1:
              # our arms as CUDA graphs; TAG: a suffix of the JSON names (A/B runs under switches)
    for n in ${TOKENS:-512 2048}; do
      timeout ${LIMIT:-400} python3 -m ggml_ciq.cli compare llama3-8b-synthetic --tokens $n --device cuda --repeat 5 \
        --reference off ${GRAPH:+--cuda-graph} --json "$OUT/prefill-llama3-8b-synthetic-n$n${GRAPH:+-graph}${TAG:+-$TAG}.json" 2>&1 \
        | tail -n 30
    done ;;
  glu-group-ab)  # API v14's A/B (issue16-f56790f): compare-8b as graphs with the GLU epilogue and the grouped launch
                 # on (default), the GLU epilogue only (GGML_CIQ_WGMMA_GROUP=0: -group0), both off (-old); TOKENS (512 2048)
    GRAPH=1 "$0" compare-8b 2>&1 | grep meets | tail -n 1
    GRAPH=1 GGML_CIQ_WGMMA_GROUP=0 TAG=group0 "$0" compare-8b 2>&1 | grep meets | tail -n 1
    GRAPH=1 GGML_CIQ_WGMMA_GROUP=0 GGML_CIQ_FUSE_GLU=0 TAG=old "$0" compare-8b 2>&1 | grep meets | tail -n 1 ;;
  sanitize)  # TOOLS="memcheck racecheck" by default; LIMIT seconds per tool (default 500); -> $OUT/sanitizer-TOOL[-CASE].txt
    shift
    for tool in ${TOOLS:-memcheck racecheck}; do
      f="$OUT/sanitizer-$tool${1:+-$1}.txt"
      timeout ${LIMIT:-500} compute-sanitizer --tool $tool --error-exitcode 9 python3 tools/sanitize_case.py "$@" > "$f" 2>&1
      echo "$tool $* exit=$? $(tail -n 1 "$f")"
    done ;;
  wait) while [ -f /tmp/llama.building ]; do sleep 5; done; tail -n 2 /tmp/llama-build.log; ls /tmp/llama/llama_cpp/lib/ | grep -E 'lib|test-backend|llama-' ;;
  py) shift; python3 "$@" ;;
  pack)  # everything under $OUT into one $OUT/NAME.tgz (a call brings back at most 8 files, 2 folders deep)
    name=${2:-results}; tar czf /tmp/$name.tgz -C "$OUT" . && rm -rf "${OUT:?}"/* && mv /tmp/$name.tgz "$OUT/" && ls -la "$OUT" ;;
  all)
    "$0" setup 2>&1 | tail -n 8
    "$0" test tests/test_cuda.py tests/test_native.py tests/test_ops.py tests/test_mmvq.py 2>&1 | tee "$OUT/pytest-gpu.txt" | tail -n 15
    "$0" sanitize
    "$0" wait 2>&1 | tail -n 3
    "$0" test tests/test_cuda.py tests/test_compare.py tests/test_layer_diff.py tests/test_mmvq.py -k "llamacpp or cuda or gpu" 2>&1 \
      | tee "$OUT/pytest-llamacpp-cuda.txt" | tail -n 8
    for model in default gemma3-270m; do
      python3 -m ggml_ciq.cli diff $model --backend ciq-cuda --reference llamacpp-cuda --variant mma --tokens 131 \
        --json "$OUT/diff-$model-mma-vs-llamacpp-cuda.json" 2>&1 | tail -n 2
      for n in 1 2 5 8; do  # llama.cpp runs MMVQ here; AUTO in its semantics runs mmvq (docs/SEMANTICS.md "mmvq")
        python3 -m ggml_ciq.cli diff $model --backend ciq-cuda --reference llamacpp-cuda --tokens $n \
          --json "$OUT/diff-$model-tokens$n-vs-llamacpp-cuda.json" 2>&1 | tail -n 1
      done
    done
    ;;
  bench)  # the committed result set: Llama-3-8B shapes at 512 and 2048 tokens, seed6 at 128 (SETS="set:tokens:name ..."
          # to choose and order them, the bars first when device time is short; LIMIT seconds a set, default 150)
    for spec in ${SETS:-"llama3-8b:512:llama3-8b-n512" "llama3-8b:2048:llama3-8b-n2048" "seed6:128:seed6"}; do
      IFS=: read -r set tokens name <<< "$spec"
      timeout ${LIMIT:-150} python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes $set --tokens $tokens \
        --repeat ${REPEAT:-5} --variants ${VARIANTS:-mma,wgmma} --json "$OUT/$name.json" 2>&1 | tail -n 16
    done ;;
  split-ab)  # the attention split's A/B (GGML_CIQ_ATTENTION_SPLIT=1|0): our prefill as graphs, Gemma at 512 and 4096
             # tokens (stage), the synthetic 8B at 512 (its weights need llama.cpp: wait) -> $OUT/prefill-*-splitS.json
    for s in 1 0; do
      for n in 512 4096; do
        GGML_CIQ_ATTENTION_SPLIT=$s timeout 100 python3 -m ggml_ciq.cli prefill "$(gemma_path)" --tokens $n --device cuda \
          --semantics fast --repeat 5 --cuda-graph --json "$OUT/prefill-gemma3-270m-$n-fast-graph-split$s.json" 2>&1 | grep -E "tokens/s|rror"
      done
      GGML_CIQ_ATTENTION_SPLIT=$s timeout 200 python3 -m ggml_ciq.cli prefill llama3-8b-synthetic --tokens 512 --device cuda \
        --semantics fast --repeat 5 --cuda-graph --json "$OUT/prefill-llama3-8b-512-fast-graph-split$s.json" 2>&1 | grep -E "tokens/s|rror"
    done ;;
  fuse-ab)  # API v11's A/B: stacked weights + fused norms/residuals (GGML_CIQ_FUSE) and wgmma's tail split
            # (GGML_CIQ_WGMMA_TAIL), our prefill as graphs: the synthetic 8B at TOKENS (512 2048; its weights need
            # llama.cpp: wait), Gemma at 512 when staged -> $OUT/prefill-*-fuseF-tailT.json
    for ft in "1 1" "0 1" "1 0" "0 0"; do
      set -- $ft
      for n in ${TOKENS:-512 2048}; do
        GGML_CIQ_FUSE=$1 GGML_CIQ_WGMMA_TAIL=$2 timeout 150 python3 -m ggml_ciq.cli prefill llama3-8b-synthetic --tokens $n \
          --device cuda --semantics fast --repeat 5 --cuda-graph --json "$OUT/prefill-llama3-8b-$n-fast-graph-fuse$1-tail$2.json" \
          2>&1 | grep -E "tokens/s|rror" | sed "s/^/fuse=$1 tail=$2 8B $n: /"
      done
      [ -f /tmp/gemma3-270m.gguf ] && GGML_CIQ_FUSE=$1 GGML_CIQ_WGMMA_TAIL=$2 timeout 100 python3 -m ggml_ciq.cli prefill \
        /tmp/gemma3-270m.gguf --tokens 512 --device cuda --semantics fast --repeat 5 --cuda-graph \
        --json "$OUT/prefill-gemma3-270m-512-fast-graph-fuse$1-tail$2.json" 2>&1 | grep -E "tokens/s|rror" | sed "s/^/fuse=$1 tail=$2 gemma 512: /"
    done ;;
  attention-ab)  # API v12's A/B: AUTO's attention wgmma (GGML_CIQ_ATTENTION_WGMMA=1) against mma (=0), our prefill as
                 # graphs: the synthetic 8B at TOKENS (512 2048 8192; its weights need llama.cpp: wait), Gemma at 512 and
                 # 4096 when staged -> $OUT/prefill-*-fast-graph-attnwgmmaW.json
    for w in 1 0; do
      for n in ${TOKENS:-512 2048 8192}; do
        GGML_CIQ_ATTENTION_WGMMA=$w timeout 150 python3 -m ggml_ciq.cli prefill llama3-8b-synthetic --tokens $n \
          --device cuda --semantics fast --repeat 5 --cuda-graph --json "$OUT/prefill-llama3-8b-$n-fast-graph-attnwgmma$w.json" \
          2>&1 | grep -E "tokens/s|rror" | sed "s/^/wgmma=$w 8B $n: /"
      done
      for n in 512 4096; do
        [ -f /tmp/gemma3-270m.gguf ] && GGML_CIQ_ATTENTION_WGMMA=$w timeout 100 python3 -m ggml_ciq.cli prefill \
          /tmp/gemma3-270m.gguf --tokens $n --device cuda --semantics fast --repeat 5 --cuda-graph \
          --json "$OUT/prefill-gemma3-270m-$n-fast-graph-attnwgmma$w.json" 2>&1 | grep -E "tokens/s|rror" | sed "s/^/wgmma=$w gemma $n: /"
      done
    done ;;
  ops-timing)  # the elementwise ops and the fused GLU conversion, new kernels against the old in one process
    python3 tools/ops_timing.py --json "$OUT/ops-timing.json" ;;
  output-row)  # Gemma's tied Q8_0 output (262144 x 640) at 1 and 8 tokens: q32, mmvq, wgmma against llama.cpp's MMVQ (wait)
    python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shape Q8_0:262144:640 --tokens 1,8 --variants q32,mmvq,wgmma \
      --repeat 5 --no-ceiling --json "$OUT/output-row-q8_0.json" 2>&1 | tail -n 12 ;;
  bench-attention)  # issue 16 deliverable 4's yardstick: our attention kernels against llama.cpp's FLASH_ATTN_EXT
                    # (CUDA0) in one process, Gemma 3 270M's and Llama-3-8B's micro-batches, split on and off (wait)
    for set in gemma3-270m llama3-8b; do for split in 1 0; do
      GGML_CIQ_ATTENTION_SPLIT=$split timeout ${LIMIT:-200} python3 -m ggml_ciq.cli bench attention --backend ciq-cuda \
        --cases $set --repeat ${REPEAT:-5} --json "$OUT/attention-$set-split$split.json" 2>&1 | tail -n 12
    done; done ;;
  bench-pdl)  # wgmma's programmatic dependent launch A/B at 512 tokens (on by default; GGML_CIQ_WGMMA_PDL=0 off)
    for pdl in 1 0; do
      GGML_CIQ_WGMMA_PDL=$pdl python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes llama3-8b --tokens 512 \
        --repeat ${REPEAT:-5} --variants wgmma --json "$OUT/wgmma-pdl$pdl-llama3-8b-n512.json" 2>&1 | tail -n 3
    done ;;
  offload-sweep)  # the registry's offload table, measured (issue 15): our kernels against llama.cpp's mul_mat in one
                  # process, each set one process with its own time limit (no bf16 ceiling: it is not the question)
    sweep() { local name=$1 limit=$2; shift 2; echo "== sweep $name"; timeout "$limit" python3 -m ggml_ciq.cli bench gemm \
      --backend ciq-cuda --no-ceiling --repeat ${REPEAT:-3} --json "$OUT/offload-$name.json" "$@" 2>&1 | grep -E "geomean|Error|error" ; }
    # wgmma vs MMQ from llama.cpp's MMQ threshold (9 tokens) up, on the Llama-3-8B shapes
    sweep wgmma-llama3-8b 240 --shapes llama3-8b --tokens ${TOKENS:-9,16,32,64,128} --variants wgmma
    # Gemma 3 270M's own weights (the weight-size bound): wgmma on its K-quants, q32 on its Q5_0/Q8_0
    gemma=$(gemma_path) && sweep gemma3-270m 150 --model "$gemma" --tokens 128,512 --variants wgmma,q32
    # the q32 kernel on 8B-sized 32-block weights (no entry in the table yet: never measured against MMQ)
    sweep q32-8b-shapes 150 --shape Q8_0:4096:4096 --shape Q8_0:14336:4096 --shape Q5_0:4096:4096 \
      --shape Q4_0:4096:4096 --tokens 16,128,512 --variants q32
    # decode sizes: our mmvq against llama.cpp's MMVQ (bit-identical arithmetic; is it faster?)
    sweep mmvq-llama3-8b 120 --shapes llama3-8b --tokens 1,8 --variants mmvq ;;
  memory)  # device memory under repetition: GEMMs over every GPU variant, GPU prefills, and (llama.cpp built: after
          # wait) 200 libllama prefills through the plugin's CIQ0 (tools/gpu_memory_repeat.py)
    plugin=; [ -f $LLAMA_BUILD/bin/libggml-cuda.so ] && [ -f $PLUGIN ] && plugin="--plugin-prefills 200"
    python3 tools/gpu_memory_repeat.py $plugin --json "$OUT/gpu-memory-repeat.json" 2>&1 | tail -n 5 ;;
  plugin-check)
    plugin_environment
    step info 120 python3 -m ggml_ciq.cli info
    step pytest-plugin 300 python3 -m pytest -q -rs -p no:cacheprovider tests/test_plugin.py
    step test-backend-ops-all 500 env GGML_BACKEND_PATH=$PLUGIN GGML_CIQ_OFFLOAD=all $LLAMA_BUILD/bin/test-backend-ops test -b CIQ0 -o MUL_MAT
    step test-backend-ops-default 500 env GGML_BACKEND_PATH=$PLUGIN $LLAMA_BUILD/bin/test-backend-ops test -b CIQ0 -o MUL_MAT
    grep -hE "tests passed|FAIL|^  Backend" "$OUT"/plugin/test-backend-ops-*.txt | sort | uniq -c | head -n 20 ;;
  plugin-perf)  # the weight types we cover; CUDA0 alone from the same binary as the yardstick
    types='type_a=(q4_K|q6_K|q4_0|q5_0|q8_0)'
    step test-backend-ops-perf-ciq0 280 env GGML_BACKEND_PATH=$PLUGIN $LLAMA_BUILD/bin/test-backend-ops perf -b CIQ0 -o MUL_MAT -p "$types"
    step test-backend-ops-perf-cuda0 280 env GGML_BACKEND_PATH=$PLUGIN $LLAMA_BUILD/bin/test-backend-ops perf -b CUDA0 -o MUL_MAT -p "$types" ;;
  plugin-bench)  # one llama-bench run per model: both device settings, same binary, same process; the 8B also at
                 # 16..128 tokens (the offload threshold end to end); Gemma also with every MUL_MAT offloaded, the 8B
                 # with none (what CIQ0's presence alone costs)
    plugin_environment
    bench() {  # bench NAME LIMIT MODEL [VAR=VALUE ...] -- LLAMA-BENCH ARGUMENTS
      local name=$1 limit=$2 model=$3 vars=(); shift 3
      while [ "$1" != "--" ]; do vars+=("$1"); shift; done; shift
      step_json "$name" "$limit" env GGML_BACKEND_PATH=$PLUGIN "${vars[@]}" $LLAMA_BUILD/bin/llama-bench -m "$model" \
        -ngl 99 -dev CUDA0,CIQ0/CUDA0 -ts 0/1 -fa ${FA:-1} -r ${REPS:-5} -o json "$@"; }
    gemma=$(gemma_path) && bench llama-bench-gemma3-270m 120 "$gemma" -- -p 512,2048 -n 128
    [ -n "$gemma" ] && bench llama-bench-gemma3-270m-offload-all 120 "$gemma" GGML_CIQ_OFFLOAD=all -- -p 512,2048 -n 0
    synth=$(python3 -c 'from ggml_ciq import catalog; print(catalog.llama3_8b_synthetic_path())') && \
      bench llama-bench-llama3-8b-synthetic 300 "$synth" -- -p 16,32,64,128,512,2048 -n 128 && \
      bench llama-bench-llama3-8b-synthetic-offload-none 120 "$synth" GGML_CIQ_OFFLOAD=none -- -p 512 -n 128
    # llama-bench's first configuration runs a few percent faster than its second: both orders, 10 repetitions each
    for model in "$gemma" "$synth"; do
      [ -n "$model" ] || continue
      name=$(basename "$model" .gguf)
      for order in CUDA0,CIQ0/CUDA0 CIQ0/CUDA0,CUDA0; do
        step_json "llama-bench-$name-order-${order%%[/,]*}-first" 120 env GGML_BACKEND_PATH=$PLUGIN $LLAMA_BUILD/bin/llama-bench \
          -m "$model" -ngl 99 -dev $order -ts 0/1 -fa ${FA:-1} -r 10 -p 512 -n 128 -o json
      done
    done ;;
  plugin-splits)  # the scheduler's splits of a Gemma prefill with CIQ0 in front and with CUDA0 alone (GGML_SCHED_DEBUG)
    gemma=$(gemma_path) || exit 1
    for devs in CIQ0/CUDA0 CUDA0; do
      GGML_SCHED_DEBUG=2 GGML_BACKEND_PATH=$PLUGIN timeout 60 $LLAMA_BUILD/bin/llama-bench -m "$gemma" -ngl 99 -dev $devs \
        -ts 0/1 -fa 1 -r 1 -p 512 -n 0 -v 2>&1 | grep "## SPLIT" > "$OUT/sched-splits-gemma3-270m-${devs%%/*}.txt"
      echo "$devs: $(awk '{print $4}' "$OUT/sched-splits-gemma3-270m-${devs%%/*}.txt" | sort | uniq -c | paste -sd' ')"
    done ;;
  breakdown)  # one engine prefill (fast semantics, eager) with its op-class times: Gemma 3 270M at 512 and 4096 tokens,
             # or MODEL=llama3-8b-synthetic (after wait: its weights need llama.cpp) at TOKENS (512 2048)
    model=${MODEL:-$(gemma_path)} name=${MODEL:-gemma3-270m}
    for n in ${TOKENS:-$([ -n "${MODEL:-}" ] && echo 512 2048 || echo 512 4096)}; do
      timeout 100 python3 -m ggml_ciq.cli prefill "$model" --tokens $n --device cuda --semantics fast --repeat 3 \
        --json "$OUT/prefill-breakdown-$name-$n.json" 2>&1 | tail -n 12
    done ;;
  gemm-diag)  # where the wgmma GEMM's time goes: the library rebuilt with CIQ_WGMMA_DIAG=1 (no dequantization) and =2
              # (no wgmma) beside the real one, wgmma alone (no llama.cpp, no ceiling) on the 8B shapes at 512 tokens and
              # seed6 -> $OUT/gemm-diag{0,1,2}-{llama3-8b-n512,seed6}.json
    diag_lib 1 && diag_lib 2 || exit 1
    for d in 0 1 2; do
      lib=/tmp/ciq-build/libggml_ciq.so; [ $d = 0 ] || lib=/tmp/ciq-diag$d/libggml_ciq.so
      for spec in "llama3-8b 512 llama3-8b-n512" "seed6 128 seed6"; do
        set -- $spec
        GGML_CIQ_LIB=$lib timeout 120 python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes $1 --tokens $2 \
          --repeat ${REPEAT:-5} --variants wgmma --no-llamacpp --no-ceiling --json "$OUT/gemm-diag$d-$3.json" 2>&1 \
          | grep -E "wgmma|rror" | sed "s/^/diag=$d /"
      done
    done ;;
  gemm-ncu)  # issue 16's next question: what the wgmma GEMM's consumers wait on, with and without the dequantization
             # (the real library and the CIQ_WGMMA_DIAG=1 build of gemm-diag, built here if missing): Nsight Compute's
             # speed-of-light, warp-state, scheduler and memory sections on one launch of SHAPE ("Q4_K 4096 14336 512")
             # -> $OUT/ncu-wgmma-diag{0,1}.txt
    diag_lib 1 || exit 1
    for d in 0 1; do
      lib=/tmp/ciq-build/libggml_ciq.so; [ $d = 0 ] || lib=/tmp/ciq-diag1/libggml_ciq.so
      GGML_CIQ_LIB=$lib timeout ${LIMIT:-240} ncu --clock-control none --kernel-name regex:gemm_wgmma --launch-skip 2 \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis python3 tools/ncu_case.py ${SHAPE:-Q4_K 4096 14336 512} \
        > "$OUT/ncu-wgmma-diag$d.txt" 2>&1
      echo "diag=$d ncu exit $?"; grep -E "Duration|Compute \(SM\) Throughput|No Eligible|Issue Slots Busy|Stall" "$OUT/ncu-wgmma-diag$d.txt" | head -n 12
    done ;;
  streamk-ab)  # wgmma's stream-K on (the time model's choice) and off (GGML_CIQ_WGMMA_STREAMK), wgmma alone on the 8B
               # shapes at 512 and 2048 tokens and seed6 -> $OUT/{llama3-8b-n512,llama3-8b-n2048,seed6}-streamk{0,1}.json
    for sk in 1 0; do
      for spec in "llama3-8b 512 llama3-8b-n512" "llama3-8b 2048 llama3-8b-n2048" "seed6 128 seed6"; do
        set -- $spec
        GGML_CIQ_WGMMA_STREAMK=$sk timeout 150 python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes $1 \
          --tokens $2 --repeat ${REPEAT:-5} --variants wgmma --no-llamacpp --no-ceiling --json "$OUT/$3-streamk$sk.json" \
          2>&1 | grep -E "wgmma|rror" | sed "s/^/streamk=$sk /"
      done
    done ;;
  baseline)  # the library of an earlier commit, for lib-ab: .baseline/native (git-ignored, carried; made here by
             # `BASELINE=COMMIT tools/prepare_device.sh`) built into /tmp/ciq-base
    [ -d .baseline/native ] && rm -rf /tmp/ciq-base-src && cp -r .baseline /tmp/ciq-base-src
    [ -d /tmp/ciq-base-src/native ] || { echo "no .baseline/native carried" >&2; exit 2; }
    GGML_CIQ_COMMIT=$(cat /tmp/ciq-base-src/COMMIT) cmake -S /tmp/ciq-base-src/native -B /tmp/ciq-base -G Ninja \
      -DGGML_CIQ_CUDA=ON -DGGML_CIQ_CUDA_ARCHITECTURES="$ARCHS" -DGGML_CIQ_PLUGIN=OFF > /tmp/ciq-base-cmake.log \
      && ninja -C /tmp/ciq-base 2>&1 | tail -n 1 ;;
  lib-ab)  # bench gemm with the baseline library (baseline) and this tree's, alternately in ROUNDS rounds (default 2),
           # llama.cpp in the process (after wait; NO_LLAMA=1: without it) -> $OUT/{NAME}-{base,new}-rR.json
           # (SETS="set:tokens:name ...", default seed6)
    for r in $(seq 1 ${ROUNDS:-2}); do
      for arm in base new; do
        lib=/tmp/ciq-build/libggml_ciq.so commit=$GGML_CIQ_COMMIT
        [ $arm = base ] && lib=/tmp/ciq-base/libggml_ciq.so commit=$(cat /tmp/ciq-base-src/COMMIT)
        for spec in ${SETS:-"seed6:128:seed6"}; do
          IFS=: read -r set tokens name <<< "$spec"
          GGML_CIQ_LIB=$lib GGML_CIQ_COMMIT=$commit timeout ${LIMIT:-150} python3 -m ggml_ciq.cli bench gemm \
            --backend ciq-cuda --shapes $set --tokens $tokens --repeat ${REPEAT:-5} --variants wgmma \
            ${NO_LLAMA:+--no-llamacpp} --no-ceiling --json "$OUT/$name-$arm-r$r.json" 2>&1 | grep -E "geomean|rror" \
            | sed "s/^/$arm r$r $name: /"
        done
      done
    done ;;
  rs-ab)  # wgmma's RS form (A from registers; GGML_CIQ_WGMMA_RS=1) against SS (=0), and RS with the 128-token tile
          # pinned (GGML_CIQ_WGMMA_CONFIG=1: the RS form's widest), wgmma alone on the 8B shapes at 512 tokens and seed6
          # (SETS="..." to choose) -> $OUT/{llama3-8b-n512,seed6}-{rs1,rs0,rs1c1}.json
    for arm in rs1 rs0 rs1c1; do
      rs=${arm:2:1}; pin=; [ "$arm" = rs1c1 ] && pin=1
      for spec in ${SETS:-"llama3-8b:512:llama3-8b-n512" "seed6:128:seed6"}; do
        IFS=: read -r set tokens name <<< "$spec"
        GGML_CIQ_WGMMA_RS=$rs GGML_CIQ_WGMMA_CONFIG=$pin timeout 150 python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda \
          --shapes $set --tokens $tokens --repeat ${REPEAT:-5} --variants wgmma --no-llamacpp --no-ceiling \
          --json "$OUT/$name-$arm.json" 2>&1 | grep -E "wgmma|rror" | sed "s/^/$arm /"
      done
    done ;;
  tail-ab)  # wgmma's tail split on and off (GGML_CIQ_WGMMA_TAIL), bench gemm's Llama-3-8B shapes at 512 tokens, wgmma
            # only (after wait) -> $OUT/llama3-8b-n512-tail{0,1}.json
    for t in 0 1; do
      GGML_CIQ_WGMMA_TAIL=$t timeout 100 python3 -m ggml_ciq.cli bench gemm --backend ciq-cuda --shapes llama3-8b \
        --tokens 512 --repeat 5 --variants wgmma --json "$OUT/llama3-8b-n512-tail$t.json" 2>&1 | tail -n 3
    done ;;
  plugin-kld)  # base logits of CUDA0 alone (fa off, fa on), then each run against them. (llama-bench separates a
                # configuration's devices with "/", the common tools with ",")
    gemma=$(gemma_path) || exit 1
    ppl() { local name=$1; shift; step "$name" 280 env GGML_BACKEND_PATH=$PLUGIN $LLAMA_BUILD/bin/llama-perplexity \
      -m "$gemma" -f $DEV/perplexity-text.txt -c 512 -b 512 -ngl 99 -fit off "$@"; }
    ppl kld-base-cuda0-fa-off -dev CUDA0 -fa off --kl-divergence-base /tmp/kld-cuda0-fa-off.bin
    ppl kld-base-cuda0-fa-on -dev CUDA0 -fa on --kl-divergence-base /tmp/kld-cuda0-fa-on.bin
    ppl kld-cuda0-fa-on-vs-off -dev CUDA0 -fa on --kl-divergence-base /tmp/kld-cuda0-fa-off.bin --kl-divergence
    ppl kld-plugin-vs-cuda0-fa-off -dev CIQ0,CUDA0 -ts 0,1 -fa off --kl-divergence-base /tmp/kld-cuda0-fa-off.bin --kl-divergence
    ppl kld-plugin-vs-cuda0-fa-on -dev CIQ0,CUDA0 -ts 0,1 -fa on --kl-divergence-base /tmp/kld-cuda0-fa-on.bin --kl-divergence
    rm -f /tmp/kld-cuda0-fa-*.bin
    grep -H -E "Mean +KLD|Maximum KLD|Same top p|^Final estimate" "$OUT"/plugin/kld-*.txt ;;
  plugin-sanitize)  # every weight type through the plugin (GGML_CIQ_OFFLOAD=all), 77 tokens: tails in every tile
    gemma=$(gemma_path) || exit 1
    step sanitizer-plugin-memcheck 500 env GGML_BACKEND_PATH=$PLUGIN GGML_CIQ_OFFLOAD=all compute-sanitizer --tool memcheck \
      --error-exitcode 9 $LLAMA_BUILD/bin/llama-bench -m "$gemma" -ngl 99 -dev CIQ0/CUDA0 -ts 0/1 -p 77 -n 0 -r 1 -fa 1 ;;
  *) echo "usage: tools/gpu_run.sh setup|test|sanitize|wait|py|pack|all|bench|bench-pdl|fuse-ab|tail-ab|offload-sweep|memory|stage|compare|compare-8b|layer-trace|graph-bench|kernel-profile|sass|plugin-splits|breakdown|plugin-check|plugin-perf|plugin-bench|plugin-kld|plugin-sanitize|bench-attention|split-ab|attention-ab|ops-timing|output-row|gemm-diag|gemm-ncu|streamk-ab|rs-ab|glu-group-ab" >&2; exit 2 ;;
esac
