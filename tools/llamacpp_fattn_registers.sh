#!/usr/bin/env bash
# Registers per thread of llama.cpp CUDA's flash-attention mma kernels for 4 q heads per K/V head (the template
# instance ncols1_16-ncols2_4: Gemma 3's and Llama 3's GQA), compiled as llama.cpp compiles them (-O3 -use_fast_math
# --extended-lambda, sm_90) with this machine's nvcc: what sets its CTAs per SM (128 threads, launch bounds 2), the
# default of GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM in native/src/cuda/attention_llamacpp.cu. cuBLAS's header is stubbed
# (only types the instance never calls). Usage: tools/llamacpp_fattn_registers.sh LLAMA_CPP_SOURCE_DIR
set -euo pipefail
src=${1:?usage: $0 LLAMA_CPP_SOURCE_DIR (vendor/llama.cpp of the llama-cpp-python sdist)}
ggml=$src/ggml
[ -f "$ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu" ] || {
  echo "llamacpp_fattn_registers: $src has no ggml-cuda flash-attention template instances" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/cublas_v2.h" <<'STUB'
#pragma once
typedef struct cublasContext *cublasHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_COMPUTE_16F = 64, CUBLAS_COMPUTE_32F = 68 } cublasComputeType_t;
static inline const char *cublasGetStatusString(cublasStatus_t) { return ""; }
static inline cublasStatus_t cublasCreate(cublasHandle_t *) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
static inline cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *, size_t) { return CUBLAS_STATUS_SUCCESS; }
STUB
echo "nvcc: $(nvcc --version | tail -n 1); llama.cpp: $src"
nvcc -std=c++17 -O3 -use_fast_math --extended-lambda -arch=sm_90 -DNDEBUG -I"$tmp" -I"$ggml/include" -I"$ggml/src" \
  -I"$ggml/src/ggml-cuda" -Xptxas=-v -c "$ggml/src/ggml-cuda/template-instances/fattn-mma-f16-instance-ncols1_16-ncols2_4.cu" \
  -o "$tmp/x.o" 2>&1 | python3 -c '
import re, sys
name = None
print("DKQ DV ncols1 ncols2 softcap registers")
for line in sys.stdin:
    m = re.search(r"Compiling entry function .(\S+).", line)
    if m: name = m.group(1)
    m = re.search(r"Used (\d+) registers", line)
    if m and name:
        t = re.search(r"flash_attn_ext_f16ILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)ELb(\d)ELb(\d)ELb(\d)", name)
        if t and t.group(6) == "0" and t.group(7) == "0":
            print(*t.groups()[:5], m.group(1))
        name = None'
