// The runtime switches (switches.h): the one table of every switch, and the one place the library reads the
// environment (switch_value; nothing else calls getenv). Each reader is called by the registry or the C API when a
// call is made, so a switch set between two calls holds for the second (the tests' monkeypatch.setenv).
#include "switches.h"

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

enum Switch {
    VARIANT,
    OFFLOAD,
    CPU_ISA,
    WGMMA_STREAMK,
    WGMMA_RS,
    WGMMA_PDL,
    WGMMA_TAIL,
    WGMMA_CONFIG,
    WGMMA_GROUP,
    ATTENTION_WGMMA,
    ATTENTION_SPLIT,
    LLAMACPP_FA_BLOCKS_PER_SM,
    FUSE,
    FUSE_GLU,
    PLUGIN_GRAPHS,
    PLUGIN_FUSE_RULE,
    PLUGIN_STATS,
    PLUGIN_ATTENTION,
    PLUGIN_GROUP,
    PLUGIN_TIMELINE,
    PLUGIN_ROPE_KV,
    SWITCH_COUNT
};

struct SwitchRow {
    Switch id;
    const char *name;
    const char *values;    // what it takes; anything else is an error naming it unless said otherwise
    const char *fallback;  // unset or empty
    const char *reader;    // who reads it and where it takes effect
    const char *meaning;
};

// Every switch: the one documented table (docs/SEMANTICS.md and docs/PLUGIN.md point here; ggml_ciq/environment.py
// SWITCHES records the set ones in results).
constexpr SwitchRow k_switches[SWITCH_COUNT] = {
    {VARIANT, "GGML_CIQ_VARIANT", "a kernel variant's name (ciq_variant_describe)", "the registry's AUTO order",
     "registry.cpp resolve_auto (GPU plans only)", "the variant AUTO resolves to on a GPU"},
    {OFFLOAD, "GGML_CIQ_OFFLOAD", "all | none", "the registry's k_offload thresholds",
     "registry.cpp offload_decision", "ciq_plan.offload: whether the ggml plugin takes a MUL_MAT"},
    {CPU_ISA, "GGML_CIQ_CPU_ISA", "scalar | avx2 | avxvnni (one the CPU has; another value: ignored)",
     "the best one built and supported", "cpu/cpu_backend.cpp ciq_cpu_features", "the host GEMM's instruction set"},
    {WGMMA_STREAMK, "GGML_CIQ_WGMMA_STREAMK", "0 | 1 | 2", "1",
     "gemm_wgmma.cu pick_plan", "0 never stream-K, 1 where the time model gains, 2 always where the kernel can"},
    {WGMMA_RS, "GGML_CIQ_WGMMA_RS", "0 | 1", "1", "gemm_wgmma.cu run_wgmma",
     "0 the SS form (A tiles through shared memory) everywhere, 1 the RS form (A from registers) wherever the "
     "weights are staged by TMA"},
    {WGMMA_PDL, "GGML_CIQ_WGMMA_PDL", "an integer (atoi; a non-number reads as 0)", "on",
     "gemm_wgmma.cu wgmma_launch_config", "0: no programmatic dependent launch (bench/results/h200/wgmma-pdl-*)"},
    {WGMMA_TAIL, "GGML_CIQ_WGMMA_TAIL", "an integer (atoi; a non-number reads as 0)", "on", "gemm_wgmma.cu pick_plan",
     "0: no tail split of the last, partial wave"},
    {WGMMA_CONFIG, "GGML_CIQ_WGMMA_CONFIG", "an index of k_wgmma_configs (0 64, 1 128, 2 256 tokens; another "
     "value: none)", "none", "gemm_wgmma.cu pick_plan", "pins the tile shape"},
    {WGMMA_GROUP, "GGML_CIQ_WGMMA_GROUP", "0 | 1 | 2", "1", "gemm_wgmma.cu ciq_cuda_gemm_wgmma_group",
     "two weights' GEMMs in one launch: 0 never, 1 where the time model gains over the two apart, 2 always where "
     "the grouped kernel runs them"},
    {ATTENTION_WGMMA, "GGML_CIQ_ATTENTION_WGMMA", "1/on/true/yes | 0/off/false/no (any case)", "on",
     "api_ops.cpp ciq_attention_resolve", "0: AUTO attention passes over wgmma (an explicit request still runs it)"},
    {ATTENTION_SPLIT, "GGML_CIQ_ATTENTION_SPLIT", "0 (off); any other value: on", "on",
     "cuda/attention_split.cuh splits_cap", "0 keeps one CTA a query tile (no split over the keys)"},
    {LLAMACPP_FA_BLOCKS_PER_SM, "GGML_CIQ_LLAMACPP_FA_BLOCKS_PER_SM", "a positive integer (another value: 2)", "2",
     "cuda/attention_llamacpp.cu", "llama.cpp flash attention's CTAs per SM (its stream-k grid) for another GPU "
     "or build"},
    {FUSE, "GGML_CIQ_FUSE", "1/on/true/yes | 0/off/false/no", "on",
     "Python: ggml_ciq/ops.py (environment.switch); the ggml plugin's plans (ciq_switch_on, when a backend starts)",
     "0 turns every API v11 fusion off (A/B runs); in the ggml plugin, its fused steps and reordered MUL_MATs (CIQi "
     "then runs our MUL_MATs alone, API v19's plan)"},
    {FUSE_GLU, "GGML_CIQ_FUSE_GLU", "1/on/true/yes | 0/off/false/no", "on",
     "Python: ggml_ciq/ops.py (environment.switch)", "0 keeps the GLU in down's activation conversion (no gate/up "
     "product fused into the wgmma epilogue)"},
    {PLUGIN_GRAPHS, "GGML_CIQ_PLUGIN_GRAPHS", "1/on/true/yes | 0/off/false/no", "off",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: CIQi captures each stretch of its steps between "
     "CUDAi's runs as a CUDA graph on its second run and replays it (off: call by call, faster on the 8B and SmolLM2 "
     "as measured, docs/PLUGIN.md)"},
    {PLUGIN_FUSE_RULE, "GGML_CIQ_PLUGIN_FUSE_RULE", "1/on/true/yes | 0/off/false/no", "on",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "0: CIQi takes its fused plan wherever GGML_CIQ_FUSE "
     "is on, not only where it at least halves CUDAi's runs (tests, A/B runs)"},
    {PLUGIN_STATS, "GGML_CIQ_PLUGIN_STATS", "1/on/true/yes | 0/off/false/no", "off",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: each CIQi backend prints one line to stderr when "
     "it is freed: graphs computed, plans, stretches run eagerly / captured / replayed, and host microseconds per "
     "graph: CUDAi's runs, ours by step kind, hand-overs, waiting in synchronize, and outside graph_compute"},
    {PLUGIN_ATTENTION, "GGML_CIQ_PLUGIN_ATTENTION", "1/on/true/yes | 0/off/false/no", "off",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: CIQi also takes q's SCALE, the K/V cache writes "
     "(SET_ROWS) and FLASH_ATTN_EXT (a prefill micro-batch one stretch of ours; off by default: measured slower on "
     "the 8B and no faster on Gemma, docs/PLUGIN.md)"},
    {PLUGIN_GROUP, "GGML_CIQ_PLUGIN_GROUP", "1/on/true/yes | 0/off/false/no", "on",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: CIQi launches adjacent MUL_MATs on one input in one "
     "grouped launch (k and v) and takes gate/up + GLU as one GLU_PAIR step, the GLU from wgmma's epilogue (on: the "
     "8B's pp512 10% faster through llama-bench, docs/PLUGIN.md); 0: each MUL_MAT and GLU its own step"},
    {PLUGIN_TIMELINE, "GGML_CIQ_PLUGIN_TIMELINE", "1/on/true/yes | 0/off/false/no", "off",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: each CIQi backend traces its graphs after the first "
     "three with timers on its stream at every boundary between CUDAi's runs and its own stretches, and prints one "
     "line to stderr when it is freed: per boundary the microseconds from graph_compute's start at which the host "
     "issued it and the GPU passed it, and when graph_compute and synchronize returned (a diagnostic: the timers cost "
     "host time, so not for speed figures)"},
    {PLUGIN_ROPE_KV, "GGML_CIQ_PLUGIN_ROPE_KV", "1/on/true/yes | 0/off/false/no", "on",
     "the ggml plugin (ciq_switch_on, when a backend starts)", "1: CIQi takes k's RoPE with its K cache write and the "
     "V cache write after it, with q's RoPE where it can wait, as one ROPE_KV step (ciq_rope_rows_set_f16: one launch "
     "where CUDAi ran two and ours one), and keeps q's product allocated until k's RoPE (graph_optimize) so that q, v "
     "and k group into one launch; 0: API v30's steps"},
};

constexpr bool rows_in_order() {
    for (int i = 0; i < SWITCH_COUNT; ++i)
        if (k_switches[i].id != i) return false;
    return true;
}
static_assert(rows_in_order(), "k_switches: one row per Switch, in its order");

// The one read of the environment.
const char *switch_value(Switch s) { return std::getenv(k_switches[s].name); }
const char *switch_name(Switch s) { return k_switches[s].name; }

// A digit switch: unset or empty gives `unset`; one digit 0 .. max its value; anything else an error naming the
// variable and what it takes.
ciq_status digit_switch(Switch s, int unset, int max, const char *expected, int *value) {
    const char *v = switch_value(s);
    *value = unset;
    if (!v || !*v) return CIQ_OK;
    if (v[0] < '0' || v[0] > '0' + max || v[1] != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s='%s': expected %s", switch_name(s), v, expected);
    *value = v[0] - '0';
    return CIQ_OK;
}

// An on/off switch for A/B runs: on unless set to a number that reads as 0 (the atoi of anything else).
bool on_unless_zero(Switch s) {
    const char *v = switch_value(s);
    return !(v && *v && std::atoi(v) == 0);
}

}  // namespace

const char *ciq_switches_variant(void) {
    const char *v = switch_value(VARIANT);
    return v != nullptr && *v != '\0' ? v : nullptr;
}

ciq_status ciq_switches_offload(int *offload) {
    const char *env = switch_value(OFFLOAD);
    *offload = -1;
    if (env != nullptr && *env != '\0') {
        if (std::strcmp(env, "all") == 0 || std::strcmp(env, "none") == 0) {
            *offload = env[0] == 'a';
            return CIQ_OK;
        }
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "GGML_CIQ_OFFLOAD=%s is not all or none", env);
    }
    return CIQ_OK;
}

// An on/off switch in the Python switches' words (environment.switch), never a guess: 1/on/true/yes or
// 0/off/false/no in any case; unset or empty: the table's default.
static ciq_status word_switch(Switch s, bool *on) {
    *on = std::strcmp(k_switches[s].fallback, "off") != 0;
    const char *v = switch_value(s);
    std::string word;
    for (const char *c = v ? v : ""; *c; ++c)
        if (!std::isspace((unsigned char)*c)) word += (char)std::tolower((unsigned char)*c);
    if (word.empty()) return CIQ_OK;
    if (word == "1" || word == "on" || word == "true" || word == "yes") {
        *on = true;
        return CIQ_OK;
    }
    if (word == "0" || word == "off" || word == "false" || word == "no") {
        *on = false;
        return CIQ_OK;
    }
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s='%s': expected 1 or 0 (on/off)", switch_name(s), v);
}

ciq_status ciq_switches_attention_wgmma(bool *take) { return word_switch(ATTENTION_WGMMA, take); }

ciq_status ciq_switches_on_off(const char *name, bool *on) {
    *on = true;
    constexpr Switch on_off[] = {FUSE, FUSE_GLU, ATTENTION_WGMMA, PLUGIN_GRAPHS, PLUGIN_FUSE_RULE, PLUGIN_STATS,
                                 PLUGIN_ATTENTION, PLUGIN_GROUP, PLUGIN_TIMELINE, PLUGIN_ROPE_KV};
    std::string names;
    for (Switch s : on_off) {
        if (name != nullptr && std::strcmp(name, switch_name(s)) == 0) return word_switch(s, on);
        names += (names.empty() ? "" : ", ") + std::string(switch_name(s));
    }
    return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_switch_on: '%s' is not an on/off switch (%s)", name ? name : "(null)",
                    names.c_str());
}

const char *ciq_switches_cpu_isa(void) { return switch_value(CPU_ISA); }

ciq_status ciq_switches_wgmma(ciq_wgmma_switches *sw) {
    *sw = ciq_wgmma_switches{};
    CIQ_TRY(digit_switch(WGMMA_STREAMK, 1, 2, "0 (never stream-K), 1 (where the time model gains) or 2 (always)",
                         &sw->stream_k));
    CIQ_TRY(digit_switch(WGMMA_RS, 1, 1, "0 (A tiles through shared memory) or 1 (A from registers where the weights "
                         "are staged by TMA)", &sw->rs));
    sw->pdl = on_unless_zero(WGMMA_PDL);
    sw->tail = on_unless_zero(WGMMA_TAIL);
    CIQ_TRY(digit_switch(WGMMA_GROUP, 1, 2, "0 (never one launch over two weights), 1 (where the time model gains) or "
                         "2 (always where the grouped kernel runs)", &sw->group));
    const char *pin = switch_value(WGMMA_CONFIG);
    const int pinned = pin && *pin ? std::atoi(pin) : -1;
    sw->config = pinned >= 0 ? pinned : -1;
    return CIQ_OK;
}

ciq_attention_switches ciq_switches_attention(void) {
    ciq_attention_switches sw;
    const char *split = switch_value(ATTENTION_SPLIT);
    sw.split = !(split != nullptr && std::strcmp(split, "0") == 0);
    const char *per_sm = switch_value(LLAMACPP_FA_BLOCKS_PER_SM);
    const int n = per_sm && *per_sm ? std::atoi(per_sm) : 0;
    sw.llamacpp_blocks_per_sm = n > 0 ? n : 2;
    return sw;
}
