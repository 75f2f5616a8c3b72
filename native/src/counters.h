// Dispatch and launch counters: the lowest unit of the library beside status.h. The API files (GEMM dispatches,
// attention dispatches) and the kernels' host code (wgmma's launches by form) call down into it; it calls nothing
// but status.cpp. The C API's readers (ciq_dispatch_count, ciq_wgmma_launch_count, ciq_attention_dispatch_count) and
// ciq_dispatch_reset are defined in counters.cpp.
#pragma once
#include "status.h"

// One successful GEMM of a resolved variant on a weight type (ciq_dispatch_count).
void ciq_counters_gemm(ciq_variant variant, ciq_type type);
// One kernel launch of the wgmma form (ciq_wgmma_form; ciq_wgmma_launch_count); other values are not counted.
void ciq_counters_wgmma_launch(int form);
// One successful attention call of a resolved kernel (ciq_attention_dispatch_count).
void ciq_counters_attention(ciq_attention_kernel kernel);
