// The runtime switches: environment variables for A/B runs and tests. switches.cpp holds the one table of them
// (k_switches: name, values, default, meaning; the Python package's own switches listed there too) and is the one
// place the library reads the environment. The registry and the C API read the switches a call needs when the call
// is made (tests change them between calls) and pass them down: ciq_wgmma_switches to the wgmma host planner,
// ciq_attention_switches to the attention kernels' launchers. No kernel file reads the environment.
// A layer of its own beside status.h and counters.h: it calls nothing but status.cpp.
#pragma once
#include "status.h"

// GGML_CIQ_WGMMA_*: the wgmma planner's and launcher's choices (gemm_wgmma.cu).
struct ciq_wgmma_switches {
    int stream_k = 1;  // GGML_CIQ_WGMMA_STREAMK: 0 never stream-K, 1 where the time model gains, 2 always
    int rs = 1;        // GGML_CIQ_WGMMA_RS: 0 the SS form everywhere, 1 the RS form wherever the weights are staged
    int config = -1;   // GGML_CIQ_WGMMA_CONFIG: the pinned tile config (the planner ignores one outside its table)
    int group = 1;     // GGML_CIQ_WGMMA_GROUP: 0 never, 1 where the time model gains, 2 always where it runs
    bool pdl = true;   // GGML_CIQ_WGMMA_PDL: programmatic dependent launch
    bool tail = true;  // GGML_CIQ_WGMMA_TAIL: the tail split
};
// GGML_CIQ_ATTENTION_SPLIT and GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM: the attention launchers' (cuda/attention*.cu).
struct ciq_attention_switches {
    bool split = true;           // GGML_CIQ_ATTENTION_SPLIT: 0 keeps one CTA a query tile (attention_split.cuh)
    int llamacpp_blocks_per_sm = 2;  // GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM (attention_llamacpp.cu)
};

// GGML_CIQ_VARIANT: the variant's name, or nullptr when unset or empty (the registry resolves the name).
const char *ciq_switches_variant(void);
// GGML_CIQ_OFFLOAD: -1 unset or empty (the registry's thresholds), 0 none, 1 all; anything else an error.
ciq_status ciq_switches_offload(int *offload);
// GGML_CIQ_ATTENTION_WGMMA: whether AUTO attention takes wgmma where it runs; a value not on/off an error.
ciq_status ciq_switches_attention_wgmma(bool *take);
// An on/off switch of the table by name (GGML_CIQ_FUSE, GGML_CIQ_FUSE_GLU, GGML_CIQ_ATTENTION_WGMMA,
// GGML_CIQ_PLUGIN_GRAPHS, GGML_CIQ_PLUGIN_FUSE_RULE, GGML_CIQ_PLUGIN_STATS, GGML_CIQ_PLUGIN_ATTENTION,
// GGML_CIQ_PLUGIN_GROUP, GGML_CIQ_PLUGIN_TIMELINE, GGML_CIQ_PLUGIN_ROPE_KV), unset or empty its default; another name or a value not on/off an
// error naming it.
ciq_status ciq_switches_on_off(const char *name, bool *on);
// GGML_CIQ_CPU_ISA: the instruction set asked for (scalar | avx2 | avxvnni), or nullptr when unset.
const char *ciq_switches_cpu_isa(void);
// GGML_CIQ_WGMMA_*, validated (an error names the variable and what it takes).
ciq_status ciq_switches_wgmma(ciq_wgmma_switches *switches);
// GGML_CIQ_ATTENTION_SPLIT and GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM (no value is an error).
ciq_attention_switches ciq_switches_attention(void);
