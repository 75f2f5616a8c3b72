#!/usr/bin/env bash
# HIP device-code compile check, no ROCm needed: Debian's clang-19 compiles the kernels (quantize.cu, gemm_wmma.cu,
# ops.cu, attention.cu; the mma/wgmma/convert_f16 stubs) for gfx1100 (RDNA3) and gfx1201 (RDNA4), wave32, with the declarations
# of native/src/cuda/hip_nogpuinc.h, and emits assembly. Fails on a compile error, or unless every WMMA variant's kernel (both weight types) contains
# v_wmma_i32_16x16x16_iu8 in its own function body. Installs clang-19 and lld-19 with apt when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v clang++-19 > /dev/null || ! command -v ld.lld-19 > /dev/null; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y clang-19 lld-19
fi

out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# Variant -> kernel template instantiation, as mangled (Itanium) name fragments; <T> is the weight type.
variants=(
  "wmma=22gemm_wmma_warp_privateIL8ciq_type<T>ELi4EE"
  "wmma-wide=22gemm_wmma_warp_privateIL8ciq_type<T>ELi8EE"
  "wmma-shared=22gemm_wmma_block_stagedIL8ciq_type<T>ELi1EE"
  "wmma-bigtile=22gemm_wmma_block_stagedIL8ciq_type<T>ELi3EE"
)
types=("Q4_K=12" "Q6_K=14")  # enum values of ciq_type (native/include/ggml_ciq.h)

# Per function: "<symbol> <number of v_wmma_i32_16x16x16_iu8 lines>", from .type ...,@function to .Lfunc_end.
wmma_per_function() {
  awk '
    /^[[:space:]]*\.type[[:space:]].*,@function/ {
      fn = $0; sub(/^[[:space:]]*\.type[[:space:]]+/, "", fn); sub(/,@function.*/, "", fn); n[fn] = 0; next
    }
    /^\.Lfunc_end/ { fn = ""; next }
    fn != "" && /v_wmma_i32_16x16x16_iu8/ { n[fn]++ }
    END { for (f in n) print f, n[f] }
  ' "$1"
}

status=0
for arch in gfx1100 gfx1201; do
  for src in quantize gemm_wmma gemm_mma gemm_wgmma convert_f16 ops ops_llamacpp attention attention_llamacpp gemm_q32 gemm_mmvq; do  # mma, wgmma, f16, mma_llamacpp: HIP stubs compile
    clang++-19 -x hip --offload-arch="$arch" --cuda-device-only -nogpuinc -nogpulib -O3 -S -std=c++17 -Wall \
      -DGGML_CIQ_HIP -DGGML_CIQ_HIP_NOGPUINC -DGGML_CIQ_WITH_CUDA -I native/include -I native/src \
      "native/src/cuda/$src.cu" -o "$out/$src-$arch.s"
  done
  kernels=$(grep -c '^[[:space:]]*\.amdhsa_kernel ' "$out/quantize-$arch.s" || true)
  echo "$arch: quantize.cu compiled, $kernels kernels"
  [ "$kernels" -eq 2 ] || { echo "  FAIL: expected 2 quantize kernels"; status=1; }
  # ops.cu: rms_norm (a block a row; a warp a row at 4 register widths; a block a row with registers at 3), rope,
  # rope + kv_store (the norm into the f16 layout is CUDA-only, as that layout), kv_store, glu and glu4, add and add4, scale, get_rows, dequantize_bf16, convert_bf16; ops_llamacpp.cu:
  # rms_norm and the fused rms_norm + rope at 256 and 1024 threads, rope, glu gelu and silu, rope + rows_set (32- and
  # 64-bit indices, and the vector form); attention.cu: the simt kernel
  # and the split's combine for head_dim 64, 96, 128, 256 (mma is CUDA-only; so is attention_llamacpp.cu); gemm_q32.cu:
  # Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 with MMQ's seams; gemm_mmvq.cu: 8 types x 1..8 tokens and quantize_q8_1.
  for expect in "ops 21" "ops_llamacpp 10" "attention 9" "attention_llamacpp 0" "gemm_q32 5" "gemm_mmvq 65"; do
    kernels=$(grep -c '^[[:space:]]*\.amdhsa_kernel ' "$out/${expect% *}-$arch.s" || true)
    echo "$arch: ${expect% *}.cu compiled, $kernels kernels"
    [ "$kernels" -eq "${expect#* }" ] || { echo "  FAIL: expected ${expect#* } ${expect% *} kernels"; status=1; }
  done
  wmma_per_function "$out/gemm_wmma-$arch.s" > "$out/counts-$arch"
  for variant in "${variants[@]}"; do
    for type in "${types[@]}"; do
      pattern="${variant#*=}"
      pattern="${pattern/<T>/${type#*=}}"
      line=$(grep -E "^[^ ]*${pattern}[^ ]* " "$out/counts-$arch" || true)
      if [ -z "$line" ]; then
        echo "  FAIL: ${variant%%=*} ${type%%=*}: no kernel ${pattern}"
        status=1
      elif [ "${line##* }" -lt 1 ]; then
        echo "  FAIL: ${variant%%=*} ${type%%=*}: ${line% *} has no v_wmma_i32_16x16x16_iu8"
        status=1
      else
        printf '  %-13s %-5s %3d x v_wmma_i32_16x16x16_iu8  %s\n' \
          "${variant%%=*}" "${type%%=*}" "${line##* }" "${line% *}"
      fi
    done
  done
done
[ "$status" -eq 0 ] && echo "hip_compile_check: OK" || echo "hip_compile_check: FAILED"
exit "$status"
