// Host backend: picks the widest int8 dot product the CPU has (AVX-VNNI, AVX2, scalar) and owns the thread count.
#include "cpu_backend.h"
#include "../switches.h"

#include <cstdlib>
#include <cstring>

#ifdef _OPENMP
#include <omp.h>
#endif

ciq_status ciq_cpu_gemm_scalar(ciq_semantics, ciq_type, const void *, int64_t, int64_t, const void *, int64_t,
                               void *, ciq_out_type);
#ifdef GGML_CIQ_X86
ciq_status ciq_cpu_gemm_avx2(ciq_semantics, ciq_type, const void *, int64_t, int64_t, const void *, int64_t,
                             void *, ciq_out_type);
#endif
#ifdef GGML_CIQ_AVXVNNI
ciq_status ciq_cpu_gemm_avxvnni(ciq_semantics, ciq_type, const void *, int64_t, int64_t, const void *, int64_t,
                                void *, ciq_out_type);
#endif

// The instruction set the GEMM uses: the best one built and supported, or a lower one named by
// GGML_CIQ_CPU_ISA (scalar | avx2 | avxvnni) so tests can run every path on one machine.
const char *ciq_cpu_features(void) {
    const char *best = "scalar";
#ifdef GGML_CIQ_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) best = "avx2";
#endif
#ifdef GGML_CIQ_AVXVNNI
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("avxvnni")) best = "avxvnni";
#endif
    const char *wanted = ciq_switches_cpu_isa();  // GGML_CIQ_CPU_ISA (switches.cpp)
    if (wanted == nullptr) return best;
    static const char *order[] = {"scalar", "avx2", "avxvnni"};
    int best_rank = 0, wanted_rank = -1;
    for (int i = 0; i < 3; ++i) {
        if (std::strcmp(order[i], best) == 0) best_rank = i;
        if (std::strcmp(order[i], wanted) == 0) wanted_rank = i;
    }
    return wanted_rank >= 0 && wanted_rank <= best_rank ? order[wanted_rank] : best;
}

ciq_status ciq_cpu_gemm(ciq_semantics semantics, ciq_type type, const void *weight, int64_t rows, int64_t k,
                        const void *x_quantized, int64_t tokens, void *out, ciq_out_type out_type) {
    const char *isa = ciq_cpu_features();
#ifdef GGML_CIQ_AVXVNNI
    if (std::strcmp(isa, "avxvnni") == 0) return ciq_cpu_gemm_avxvnni(semantics, type, weight, rows, k, x_quantized, tokens, out, out_type);
#endif
#ifdef GGML_CIQ_X86
    if (std::strcmp(isa, "avx2") == 0) return ciq_cpu_gemm_avx2(semantics, type, weight, rows, k, x_quantized, tokens, out, out_type);
#endif
    (void)isa;
    return ciq_cpu_gemm_scalar(semantics, type, weight, rows, k, x_quantized, tokens, out, out_type);
}

int ciq_cpu_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

void ciq_cpu_set_threads(int threads) {
#ifdef _OPENMP
    omp_set_num_threads(threads > 0 ? threads : omp_get_num_procs());
#else
    (void)threads;
#endif
}

bool ciq_cpu_avx2(void) { return std::strcmp(ciq_cpu_features(), "scalar") != 0; }
