// The dispatch and launch counters (counters.h): relaxed atomics, read by the C API's count calls, zeroed together
// by ciq_dispatch_reset.
#include "counters.h"

#include <atomic>

// GEMM dispatches: [variant][type slot] (slots: Q4_K, Q6_K, Q4_0, Q5_0, Q8_0, Q4_1, Q5_1, Q5_K, the types a variant
// multiplies).
static const ciq_type k_counted_types[] = {CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K, CIQ_TYPE_Q4_0, CIQ_TYPE_Q5_0, CIQ_TYPE_Q8_0,
                                           CIQ_TYPE_Q4_1, CIQ_TYPE_Q5_1, CIQ_TYPE_Q5_K};
constexpr int COUNTED_TYPES = sizeof(k_counted_types) / sizeof(k_counted_types[0]);
static std::atomic<uint64_t> g_dispatch[CIQ_VARIANT_COUNT][COUNTED_TYPES];
static std::atomic<uint64_t> g_wgmma_launches[CIQ_WGMMA_FORM_GLU + 1];
static std::atomic<uint64_t> g_attention_dispatch[CIQ_ATTENTION_WGMMA + 1];

static int counted_slot(ciq_type type) {
    for (int i = 0; i < COUNTED_TYPES; ++i) {
        if (k_counted_types[i] == type) return i;
    }
    return -1;
}

void ciq_counters_gemm(ciq_variant variant, ciq_type type) {
    g_dispatch[variant][counted_slot(type)].fetch_add(1, std::memory_order_relaxed);
}

void ciq_counters_wgmma_launch(int form) {
    if (form >= CIQ_WGMMA_FORM_SS && form <= CIQ_WGMMA_FORM_GLU) g_wgmma_launches[form].fetch_add(1);
}

void ciq_counters_attention(ciq_attention_kernel kernel) {
    g_attention_dispatch[kernel].fetch_add(1, std::memory_order_relaxed);
}

ciq_status ciq_dispatch_count(ciq_variant variant, ciq_type type, uint64_t *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dispatch_count: count is NULL");
    if ((int)variant < 0 || variant >= CIQ_VARIANT_COUNT) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dispatch_count: unknown kernel variant %d", (int)variant);
    }
    if (counted_slot(type) < 0) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_dispatch_count: no variant multiplies weight type %d", (int)type);
    }
    *count = g_dispatch[variant][counted_slot(type)].load();
    return CIQ_OK;
}

ciq_status ciq_wgmma_launch_count(ciq_wgmma_form form, uint64_t *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_wgmma_launch_count: count is NULL");
    if ((int)form < CIQ_WGMMA_FORM_SS || (int)form > CIQ_WGMMA_FORM_GLU)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_wgmma_launch_count: unknown wgmma form %d", (int)form);
    *count = g_wgmma_launches[form].load();
    return CIQ_OK;
}

ciq_status ciq_attention_dispatch_count(ciq_attention_kernel kernel, uint64_t *count) {
    if (count == nullptr) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_attention_dispatch_count: count is NULL");
    if ((int)kernel < CIQ_ATTENTION_AUTO || kernel > CIQ_ATTENTION_WGMMA) {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "unknown attention kernel %d", (int)kernel);
    }
    *count = g_attention_dispatch[kernel].load();
    return CIQ_OK;
}

ciq_status ciq_dispatch_reset(void) {
    for (auto &per_variant : g_dispatch) {
        for (auto &counter : per_variant) counter.store(0);
    }
    for (auto &counter : g_wgmma_launches) counter.store(0);
    for (auto &counter : g_attention_dispatch) counter.store(0);
    return CIQ_OK;
}
