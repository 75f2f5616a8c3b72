// gemm_wgmma.cu - the host side of the wgmma GEMM (its kernel: gemm_wgmma_kernel.cuh): the planner and the launch.
//   switches      : ciq_wgmma_switches, read by the caller (registry.cpp, api_gemm.cpp) and passed in; a pinned tile
//                   config outside k_wgmma_configs pins none (wgmma_plan_switches).
//   time model    : k_wgmma_efficiency and pick_plan: the tile config, split-K, the tail split or stream-K of least
//                   modelled time (wave_ctas: CTAs a wave holds, from cudaOccupancyMaxActiveClusters).
//   launch        : wgmma_launch_config (grid, cluster, PDL), launch_wgmma / dispatch_wgmma (a plan's one or two
//                   launches, each counted by form: counters.h), the tensor maps (wgmma_x_map, wgmma_w_map).
//   entry points  : ciq_cuda_gemm_wgmma, _outputs, _glu, _group (cuda_backend.h), after their argument checks;
//                   per device the SM count, L2 size and stream-K's hand-over slots (wgmma_device_state).
#include "../counters.h"
#include "gemm_wgmma_kernel.cuh"

#include <atomic>
#include <climits>
#include <mutex>
#include <vector>

#if !defined(GGML_CIQ_HIP)

// Time model for choosing the tile and the split: waves of one CTA per SM, each CTA's super-blocks plus one for
// pipeline fill and epilogue, at the tile's throughput per SM (3.4 TFLOP/s for 256-token tiles, times the relative
// efficiencies below: pinned A/B runs on the H200, bench/results/h200/wgmma-ab-*.json; 64-token tiles estimated),
// plus, for split-K, each CTA reading its share of the cluster's partial tiles (128 x BN floats) at ~100 GB/s.
static constexpr float k_wgmma_efficiency[k_wgmma_config_count] = {0.4f, 0.69f, 1.0f};

// A plan: tile config, and the tiles (row tile fastest) as `main` tiles split `splits` ways (kb_per_split units
// each), then the rest - the last, partial wave of an unsplit plan - as a second launch that fills the SMs the partial
// wave would leave idle: split tail_splits ways (tail_kb_per_split), or, tail_ctas > 0, stream-K on tail_ctas CTAs
// (wgmma_stream_k; the rest may then also be all the tiles, main 0).
struct wgmma_plan {
    int config, splits, kb_per_split;
    int64_t main = -1;  // tiles of the first launch (-1: all)
    int tail_splits = 1, tail_kb_per_split = 0;
    int tail_ctas = 0;
    float *partial = nullptr;  // stream-K's hand-over slots and flags (wgmma_stream_k)
    int *flags = nullptr;
    bool pdl = true;  // launched as programmatic dependents (ciq_wgmma_switches.pdl)
    double model_s = 0;  // the time model's seconds for it (pick_plan)
};

// wgmma's switches (GGML_CIQ_WGMMA_*: switches.cpp's table says what each takes), read by the caller once a call and
// passed down; a pinned tile config outside k_wgmma_configs pins none.
static ciq_wgmma_switches wgmma_plan_switches(const ciq_wgmma_switches &sw) {
    ciq_wgmma_switches out = sw;
    if (out.config >= k_wgmma_config_count) out.config = -1;
    return out;
}

template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T>
static void wgmma_launch_config(cudaLaunchConfig_t &config, cudaLaunchAttribute (&attrs)[2], dim3 grid, bool pdl) {
    constexpr wgmma_tile_config cfg = k_wgmma_configs[C];
    config = {};
    config.gridDim = grid;
    config.stream = ciq_stream();
    config.blockDim = dim3(wgmma_threads(cfg.producers, RS && TMA_W));
    config.dynamicSmemBytes = wgmma_kernel_smem<T, C, TMA_W, RS, T1>();
    config.attrs = attrs;
    if (grid.z > 1) {  // the split-K CTAs of a tile form one cluster
        cudaLaunchAttribute &cluster = attrs[config.numAttrs++];
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = 1, cluster.val.clusterDim.z = grid.z;
    }
    if (pdl) {
        cudaLaunchAttribute &dependent = attrs[config.numAttrs++];
        dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
        dependent.val.programmaticStreamSerializationAllowed = 1;
    }
}

// CTAs of one kernel that run at once as clusters of `splits` (-1: none): a cluster's CTAs must share a GPC, so not
// every SM is usable for every cluster size (cudaOccupancyMaxActiveClusters; cached: all GPUs are taken to be alike).
template <ciq_type T, int C, bool TMA_W, bool RS> static int wave_ctas(int splits, int sms) {
    if (splits == 1) return sms;
    static std::atomic<int> cached[CIQ_WGMMA_MAX_SPLITS + 1] = {};
    int n = cached[splits].load();
    if (n == 0) {
        constexpr auto kernel = wgmma_kernel<T, C, TMA_W, RS>();
        int clusters = 0;
        cudaLaunchConfig_t config;
        cudaLaunchAttribute attrs[2];
        wgmma_launch_config<T, C, TMA_W, RS>(config, attrs, dim3(1, 1, splits), false);  // cached: never with PDL
        if (ciq_raise_smem_limit<kernel>((int)config.dynamicSmemBytes, "ciq_cuda_gemm_wgmma") != CIQ_OK ||
            cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) != cudaSuccess)
            clusters = 0;
        cudaGetLastError();
        n = clusters > 0 ? clusters * splits : -1;
        cached[splits].store(n);
    }
    return n;
}

// The plan of the least modelled time (sw.config pins the tile shape; sw.tail, sw.stream_k: ciq_wgmma_switches).
template <ciq_type T, bool TMA_W, bool RS>
static wgmma_plan pick_plan(int64_t rows, int64_t tokens, int nb, int sms, int64_t l2_bytes, const ciq_wgmma_switches &sw) {
    static constexpr int (*k_wave_ctas[])(int, int) = {wave_ctas<T, 0, TMA_W, RS>, wave_ctas<T, 1, TMA_W, RS>,
                                                       wave_ctas<T, 2, TMA_W, RS>};
    static_assert(sizeof(k_wave_ctas) / sizeof(k_wave_ctas[0]) == k_wgmma_config_count, "one entry per tile config");
    wgmma_plan best{1, 1, nb};
    double best_s = 1e30;
    const int64_t row_tiles = (rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS;
    for (int c = 0; c < k_wgmma_config_count; ++c) {
        if (sw.config >= 0 && c != sw.config) continue;
        const int bn = k_wgmma_configs[c].bn;
        const int64_t tiles = row_tiles * ((tokens + bn - 1) / bn);
        // seconds per K value of a tile; a unit is 64 values per stage, and pipeline fill + epilogue one super-block
        const double value_s = 2.0 * CIQ_WGMMA_ROWS * bn / (3.4e12 * k_wgmma_efficiency[c]);
        constexpr int unit_values = CIQ_WGMMA_KSTAGE * wgmma_unit_stages(T);
        // seconds of one wave of CTAs that each run `per` units (+ the split-K reduction's reads)
        auto wave_s = [&](int splits, int per) {
            return ((double)per * unit_values + QK_K) * value_s + (splits > 1 ? 4.0 * CIQ_WGMMA_ROWS * bn / 1.0e11 : 0.0);
        };
        for (int splits = 1; splits <= CIQ_WGMMA_MAX_SPLITS && splits <= nb; ++splits) {
            const int per = (nb + splits - 1) / splits, used = (nb + per - 1) / per;
            const int wave = used == splits ? k_wave_ctas[c](splits, sms) : -1;
            if (wave <= 0) continue;
            const int64_t waves = (tiles * splits + wave - 1) / wave;
            const double s = waves * wave_s(splits, per);
            if (s < best_s * 0.999) {
                best_s = s;
                best = {c, splits, per};
            }
        }
        // Full unsplit waves, then the partial wave's tiles split so that they fill one wave (sw.tail off: never)
        const int64_t wave1 = k_wave_ctas[c](1, sms), main = tiles / wave1 * wave1, rest = tiles - main;
        if (main > 0 && rest > 0 && sw.tail) {
            for (int splits = 2; splits <= CIQ_WGMMA_MAX_SPLITS && splits <= nb; ++splits) {
                const int per = (nb + splits - 1) / splits, used = (nb + per - 1) / per;
                const int wave = used == splits ? k_wave_ctas[c](splits, sms) : -1;
                if (wave <= 0 || rest * splits > wave) continue;
                const double s = main / wave1 * wave_s(1, nb) + wave_s(splits, per);
                if (s < best_s * 0.999) {
                    best_s = s;
                    best = {c, 1, nb, main, splits, per};
                }
            }
        }
        // Stream-K over the tiles after the full waves, or after all but one (GGML_CIQ_WGMMA_STREAMK=0: never): one CTA
        // an SM, each ~units/CTAs units in up to ceil(U/nb) + 1 segments (each a pipeline fill and an epilogue), and an
        // owner reads up to ceil(nb/U) peers' partial tiles (written once, read once: the split-K reduction's rate)
        // Measured (bench/results/h200/streamk-*): a range shorter than a tile lost (seed6's 12288 x 2048, 6 units of 8:
        // +7%), and so did activations beyond a quarter of the L2 (4096 x 14336 at 2048 tokens, 59 MB: +15%; the CTAs'
        // ranges start at other K, so the activations no longer pass through the L2 once per wave)
        const bool fits_l2 = (double)tokens * nb * unit_values * 2 <= l2_bytes / 4.0;
        if (TMA_W && sw.stream_k == 1 && fits_l2) {  // (kernels reading weights into registers: never)
            const int64_t full_waves = tiles / wave1;
            for (int64_t mw = full_waves; mw >= 0 && mw >= full_waves - 1; --mw) {
                const int64_t rest = tiles - mw * wave1, units = rest * nb;
                if (rest <= 0 || units <= 0) continue;
                const int64_t ctas = std::min<int64_t>(sms, units), per = (units + ctas - 1) / ctas;
                if (units % ctas == 0 && per % nb == 0) continue;  // whole tiles a CTA: the unsplit plan
                if (per < nb) continue;  // less than a tile a CTA
                const int64_t segments = (per + nb - 1) / nb + 1, peers = (nb + per - 1) / per;
                const double s = mw * wave_s(1, nb) + ((double)per * unit_values + segments * QK_K) * value_s +
                                 peers * 8.0 * CIQ_WGMMA_ROWS * bn / 1.0e11;
                if (s < best_s * 0.999) {
                    best_s = s;
                    best = {c, 1, nb, mw * wave1, 1, 0, (int)ctas};
                }
            }
        }
    }
    if (TMA_W && sw.stream_k == 2) {  // every tile of the chosen tile shape streamed
        const int bn = k_wgmma_configs[best.config].bn;
        const int64_t units = row_tiles * ((tokens + bn - 1) / bn) * nb;
        best = {best.config, 1, nb, 0, 1, 0, (int)std::min<int64_t>(sms, units)};
    }
    best.model_s = best_s;
    return best;
}

// A launch over several weights (the RS form: ciq_cuda_gemm_wgmma_group, _glu_pair) gets weights 1 and 2's maps and
// where their tiles start (wgmma_group_tiles); one weight's, none (wmap stands in for the unread maps).
struct wgmma_group {
    const CUtensorMap *wmap1 = nullptr, *wmap2 = nullptr;
    wgmma_group_tiles tiles{INT_MAX, INT_MAX, INT_MAX, 0};
};

template <ciq_type T, int C, bool TMA_W, bool RS, ciq_type T1 = T>
static ciq_status launch_wgmma(const CUtensorMap &xmap, const CUtensorMap &wmap, const void *weight, int64_t rows,
                               int nb, const float *scales, int64_t tokens, const wgmma_plan &plan,
                               const wgmma_outputs &outs, ciq_out_type out_type, const wgmma_group &group) {
    constexpr auto kernel = wgmma_kernel<T, C, TMA_W, RS, T1>();
    const ciq_status status = ciq_raise_smem_limit<kernel>(wgmma_kernel_smem<T, C, TMA_W, RS, T1>(), "ciq_cuda_gemm_wgmma");
    if (status != CIQ_OK) return status;
    const int row_tiles = (int)((rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS);
    const int64_t tiles = (int64_t)row_tiles * ((tokens + k_wgmma_configs[C].bn - 1) / k_wgmma_configs[C].bn);
    const int64_t main = plan.main < 0 ? tiles : plan.main;
    // the main tiles, then (a tail plan) the rest as a second launch, a programmatic dependent of the first
    for (int part = 0; part < 2; ++part) {
        const int64_t first = part ? main : 0, count = part ? tiles - main : main;
        if (count <= 0) continue;
        const int splits = part ? plan.tail_splits : plan.splits, per = part ? plan.tail_kb_per_split : plan.kb_per_split;
        const bool stream_k = part && plan.tail_ctas > 0;
        const wgmma_stream_k sk{stream_k ? count : 0, plan.partial, plan.flags};
        cudaLaunchConfig_t config;
        cudaLaunchAttribute attrs[2];
        wgmma_launch_config<T, C, TMA_W, RS, T1>(config, attrs, dim3((unsigned)(stream_k ? plan.tail_ctas : count), 1,
                                                                 (unsigned)splits), plan.pdl);
        const cudaError_t err = cudaLaunchKernelEx(&config, kernel, xmap, wmap, (const uint8_t *)weight, rows, nb,
                                                   scales, (int)tokens, per, (int)first, row_tiles, outs, out_type, sk,
                                                   group.wmap1 ? *group.wmap1 : wmap,
                                                   group.wmap2 ? *group.wmap2 : wmap, group.tiles);
        if (err != cudaSuccess) return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: %s", cudaGetErrorString(err));
        ciq_counters_wgmma_launch(RS && TMA_W ? CIQ_WGMMA_FORM_RS : CIQ_WGMMA_FORM_SS);
        if (stream_k) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_STREAM_K);
        if (group.wmap1 != nullptr && !group.tiles.glu_pair) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_GROUPED);
        if (outs.glu) ciq_counters_wgmma_launch(CIQ_WGMMA_FORM_GLU);
    }
    return CIQ_OK;
}

template <ciq_type T, bool TMA_W, bool RS, ciq_type T1 = T, int C = 0>
static ciq_status dispatch_wgmma(const CUtensorMap &xmap, const CUtensorMap &wmap, const void *weight, int64_t rows,
                                 int nb, const float *scales, int64_t tokens, const wgmma_plan &plan,
                                 const wgmma_outputs &outs, ciq_out_type out_type, const wgmma_group &group = {}) {
    if constexpr (C < k_wgmma_config_count) {
        if (plan.config == C)
            return launch_wgmma<T, C, TMA_W, RS, T1>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type,
                                                     group);
        return dispatch_wgmma<T, TMA_W, RS, T1, C + 1>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs,
                                                       out_type, group);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: bad tile config %d", plan.config);
    }
}

// The activations' tensor map: 64 K values x bn tokens per box, 128-byte swizzle, zeros past the last token.
static ciq_status wgmma_x_map(encode_tiled_fn encode, const void *x_f16, int64_t k, int64_t tokens, int bn,
                              CUtensorMap *xmap) {
    const cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)tokens}, strides[1] = {(cuuint64_t)k * 2};
    const cuuint32_t box[2] = {CIQ_WGMMA_KSTAGE, (cuuint32_t)bn}, unit[2] = {1, 1};
    const CUresult res = encode(xmap, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void *>(x_f16), dims, strides, box,
                                unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS)
        return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: cuTensorMapEncodeTiled (activations) error %d", (int)res);
    return CIQ_OK;
}
// A staged weight's tensor map: bytes, one block (wbox bytes) x box_rows rows per box (a GLU pair's: 64), zeros past
// the last row.
static ciq_status wgmma_w_map(encode_tiled_fn encode, const void *weight, int64_t row_bytes, int64_t rows, int wbox,
                              CUtensorMap *wmap, int box_rows = CIQ_WGMMA_ROWS) {
    const cuuint64_t dims[2] = {(cuuint64_t)row_bytes, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)row_bytes};
    const cuuint32_t box[2] = {(cuuint32_t)wbox, (cuuint32_t)box_rows}, unit[2] = {1, 1};
    const CUresult res = encode(wmap, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void *>(weight), dims, strides, box,
                                unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (res != CUDA_SUCCESS)
        return ciq_fail(CIQ_ERR_BACKEND, "ciq_cuda_gemm_wgmma: cuTensorMapEncodeTiled (weights) error %d", (int)res);
    return CIQ_OK;
}

// Weights go through TMA into shared memory when the rows allow a tensor map (16-byte-aligned base and row pitch:
// every Q4_K matrix, Q6_K with K a multiple of 2048); otherwise the producers read them into registers.
template <ciq_type T>
static ciq_status run_wgmma(const void *x_f16, int64_t k, const void *weight, int64_t row_bytes, int64_t rows, int nb,
                            const float *scales, int64_t tokens, int sms, int64_t l2_bytes, const ciq_wgmma_switches &sw,
                            const wgmma_stream_k &ws, const wgmma_outputs &outs, ciq_out_type out_type) {
    // Q4_K / Q5_K rows (144 / 176 B blocks, 16-byte-aligned weights) always allow it; Q6_K rows (210 B) when
    // K % 2048 == 0; the 32-value block types never (their blocks straddle any 16-byte box).
    const bool tma_w = wgmma_kquant(T) && (uintptr_t)weight % 16 == 0 && row_bytes % 16 == 0;
    wgmma_plan plan;
    if constexpr (wgmma_kquant(T)) {
        if (tma_w) plan = sw.rs ? pick_plan<T, true, true>(rows, tokens, nb, sms, l2_bytes, sw)
                                : pick_plan<T, true, false>(rows, tokens, nb, sms, l2_bytes, sw);
    }
    if constexpr (!wgmma_always_staged(T)) {  // Q4_K/Q5_K rows always allow TMA
        if (!tma_w) plan = pick_plan<T, false, false>(rows, tokens, nb, sms, l2_bytes, sw);
    }
    plan.partial = ws.partial, plan.flags = ws.flags;
    plan.pdl = sw.pdl;

    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap xmap, wmap;
    CIQ_TRY(wgmma_x_map(encode, x_f16, k, tokens, k_wgmma_configs[plan.config].bn, &xmap));
    if constexpr (wgmma_kquant(T)) {
        if (tma_w) {
            CIQ_TRY(wgmma_w_map(encode, weight, row_bytes, rows, sw.rs ? wgmma_rs_wbox(T) : wgmma_wbox(T), &wmap));
            return sw.rs ? dispatch_wgmma<T, true, true>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type)
                      : dispatch_wgmma<T, true, false>(xmap, wmap, weight, rows, nb, scales, tokens, plan, outs, out_type);
        }
    }
    if constexpr (!wgmma_always_staged(T)) {
        return dispatch_wgmma<T, false, false>(xmap, xmap, weight, rows, nb, scales, tokens, plan, outs, out_type);
    } else {
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: Q4_K/Q5_K weights must be 16-byte aligned");
    }
}

// What the planner and stream-K need of a device, once: its SMs, its L2, and stream-K's hand-over slots (the widest
// tile's partial sums, a CTA of one an SM) and flags in scratch slot 3 (nothing else asks for that slot, always this
// size: it never moves, so no graph captured after a first call goes stale), the flags zeroed once (each launch leaves
// them 0). A first call inside a graph capture fails as any first scratch allocation there does.
struct wgmma_device {
    bool ready = false;
    int sms = 132;
    int64_t l2_bytes = 50 << 20;
    wgmma_stream_k ws{};
};
static ciq_status wgmma_device_state(int device, wgmma_device &out) {
    static std::mutex mutex;
    static std::vector<wgmma_device> states;  // [device]
    std::lock_guard<std::mutex> lock(mutex);
    if ((size_t)device >= states.size()) states.resize(device + 1);
    wgmma_device &d = states[device];
    if (!d.ready) {
        int sms = 0, l2 = 0;
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
        d.sms = sms > 0 ? sms : 132;
        d.l2_bytes = l2 > 0 ? l2 : 50 << 20;
        const size_t slots = (size_t)d.sms * 256 * CIQ_WGMMA_ROWS * sizeof(float);
        void *p = nullptr;
        CIQ_TRY(ciq_cuda_scratch(device, 3, slots + (size_t)d.sms * sizeof(int), &p));
        CIQ_TRY(ciq_cuda_memset(device, (uint8_t *)p + slots, 0, (size_t)d.sms * sizeof(int)));
        d.ws.partial = (float *)p;
        d.ws.flags = (int *)((uint8_t *)p + slots);
        d.ready = true;
    }
    out = d;
    return CIQ_OK;
}

// Problems whose tile and K counts fit the kernels' int arithmetic (tiles: an int grid.x); larger: unsupported.
static ciq_status wgmma_check_size(const char *fn, int64_t rows, int64_t k, int64_t tokens) {
    if (tokens > INT32_MAX / 2 || k > INT32_MAX / 2 ||
        (rows + CIQ_WGMMA_ROWS - 1) / CIQ_WGMMA_ROWS * ((tokens + 63) / 64) > INT32_MAX)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: problem too large (k %lld, tokens %lld)", fn, (long long)k,
                        (long long)tokens);
    return CIQ_OK;
}

static ciq_status gemm_wgmma(int device, const ciq_wgmma_switches &switches, ciq_type type, const void *weight,
                             int64_t rows, int64_t k, const void *x_f16, int64_t tokens, const wgmma_outputs &outs,
                             ciq_out_type out_type) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q5_K && type != CIQ_TYPE_Q6_K && type != CIQ_TYPE_Q4_0 &&
        type != CIQ_TYPE_Q5_0 && type != CIQ_TYPE_Q8_0 && type != CIQ_TYPE_Q4_1 && type != CIQ_TYPE_Q5_1)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: unknown weight type %d", (int)type);
    const int64_t unit_values = wgmma_kquant(type) ? QK_K : CIQ_WGMMA_KSTAGE;
    if (k <= 0 || k % unit_values != 0)  // whole super-blocks; the 32-value blocks two to a stage
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: K must be a multiple of %lld for weight type %d, "
                        "got %lld", (long long)unit_values, (int)type, (long long)k);
    CIQ_TRY(wgmma_check_size("ciq_cuda_gemm_wgmma", rows, k, tokens));
    if ((uintptr_t)x_f16 % 16 != 0 || (uintptr_t)weight % (wgmma_always_staged(type) ? 16 : 2) != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT,
                        "ciq_cuda_gemm_wgmma: activations (and Q4_K/Q5_K weights) must be 16-byte aligned, other "
                        "weights 2-byte");
    const ciq_wgmma_switches sw = wgmma_plan_switches(switches);
    wgmma_device dev;
    CIQ_TRY(wgmma_device_state(device, dev));
    const float *scales = (const float *)((const uint8_t *)x_f16 + ciq_f16_scale_offset(tokens, k));
    switch (type) {  // nb: weight units per row (super-blocks, or pairs of 32-value blocks)
#define CIQ_WGMMA_RUN(T)                                                                                             \
    case T: {                                                                                                         \
        const int nb = (int)(k / (CIQ_WGMMA_KSTAGE * wgmma_unit_stages(T)));                                          \
        return run_wgmma<T>(x_f16, k, weight, (int64_t)nb * wgmma_unit_bytes(T), rows, nb, scales, tokens, dev.sms,   \
                            dev.l2_bytes, sw, dev.ws, outs, out_type);                                                \
    }
        CIQ_WGMMA_RUN(CIQ_TYPE_Q4_K)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q6_K)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q4_0)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q5_0)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q8_0)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q4_1)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q5_1)
        CIQ_WGMMA_RUN(CIQ_TYPE_Q5_K)
#undef CIQ_WGMMA_RUN
        default: return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma: unknown weight type %d", (int)type);
    }
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

ciq_status ciq_cuda_gemm_wgmma(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                               int64_t rows, int64_t k, const void *x_f16, int64_t tokens, void *out,
                               ciq_out_type out_type) {
    wgmma_outputs outs{};
    outs.n = 1;
    outs.vec = out_type == CIQ_OUT_F32 && rows % 4 == 0 && aligned16(out);
    outs.row_end[0] = rows;
    outs.out[0] = out;
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, out_type);
}

// The epilogue's outputs of ciq_gemm_output[n_outputs] over a product of `rows` rows (unsupported: a boundary inside
// a tile).
static ciq_status wgmma_make_outputs(const ciq_gemm_output *outputs, int n_outputs, int64_t rows, ciq_out_type out_type,
                                     wgmma_outputs &outs) {
    if (n_outputs < 1 || n_outputs > CIQ_GEMM_OUTPUTS_MAX)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_outputs: %d outputs", n_outputs);
    outs = {};
    outs.n = n_outputs;
    int64_t end = 0;
    for (int s = 0; s < n_outputs; ++s) {
        const ciq_gemm_output &o = outputs[s];
        if (s + 1 < n_outputs && o.rows % CIQ_WGMMA_ROWS != 0)  // a tile would straddle two outputs
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_outputs: output %d has %lld rows, not a multiple "
                            "of %d", s, (long long)o.rows, CIQ_WGMMA_ROWS);
        end += o.rows;
        outs.row_end[s] = end;
        outs.out[s] = o.out;
        outs.add[s] = o.add;
        if (out_type == CIQ_OUT_F32 && o.rows % 4 == 0 && aligned16(o.out) && aligned16(o.add)) outs.vec |= 1 << s;
    }
    if (end != rows) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_outputs: outputs of %lld rows for %lld",
                                     (long long)end, (long long)rows);
    return CIQ_OK;
}

ciq_status ciq_cuda_gemm_wgmma_outputs(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                       int64_t rows, int64_t k, const void *x_f16, int64_t tokens,
                                       const ciq_gemm_output *outputs, int n_outputs, ciq_out_type out_type) {
    wgmma_outputs outs;
    CIQ_TRY(wgmma_make_outputs(outputs, n_outputs, rows, out_type, outs));
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, out_type);
}

ciq_status ciq_cuda_gemm_wgmma_glu(int device, const ciq_wgmma_switches &sw, ciq_type type, const void *weight,
                                   int64_t rows, int64_t k, const void *x_f16, int64_t tokens, bool gelu, float *out) {
    if (rows % (2 * CIQ_GLU_INTERLEAVE) != 0)
        return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "ciq_cuda_gemm_wgmma_glu: %lld rows, not a multiple of %d",
                        (long long)rows, 2 * CIQ_GLU_INTERLEAVE);
    static_assert(2 * CIQ_GLU_INTERLEAVE == CIQ_WGMMA_ROWS, "a tile is one interleaved block of gate and up rows");
    wgmma_outputs outs{};
    outs.n = 1;
    outs.glu = gelu ? 2 : 1;
    outs.vec = aligned16(out);
    outs.row_end[0] = rows;
    outs.out[0] = out;
    return gemm_wgmma(device, sw, type, weight, rows, k, x_f16, tokens, outs, CIQ_OUT_F32);
}

// A grouped launch of weights types[0..n) (T0 ... then T1 ...; T0 == T1: one type), planned as one problem of their
// rows (the wider type's slots: its occupancy); GGML_CIQ_WGMMA_GROUP=1 runs it only where the time model gains on
// the weights apart.
template <ciq_type T0, ciq_type T1>
static ciq_status run_wgmma_group(int device, const ciq_wgmma_switches &sw, int n, const ciq_type *types,
                                  const void *const *weights, const int64_t *rows, int64_t total, int nb,
                                  const void *x_f16, int64_t k, int64_t tokens, const wgmma_outputs &outs,
                                  ciq_out_type out_type) {
    constexpr ciq_type WIDE = wgmma_rs_wbox(T0) >= wgmma_rs_wbox(T1) ? T0 : T1;
    wgmma_device dev;
    CIQ_TRY(wgmma_device_state(device, dev));
    wgmma_plan plan = pick_plan<WIDE, true, true>(total, tokens, nb, dev.sms, dev.l2_bytes, sw);
    if (sw.group == 1) {  // the weights apart, as ciq_cuda_gemm_wgmma_outputs would plan them
        double apart = 0;
        for (int i = 0; i < n; ++i)
            apart += types[i] == T0 ? pick_plan<T0, true, true>(rows[i], tokens, nb, dev.sms, dev.l2_bytes, sw).model_s
                                    : pick_plan<T1, true, true>(rows[i], tokens, nb, dev.sms, dev.l2_bytes, sw).model_s;
        if (plan.model_s >= apart)
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma_group: the time model gains nothing (%.1f us "
                            "grouped, %.1f apart)", plan.model_s * 1e6, apart * 1e6);
    }
    plan.partial = dev.ws.partial, plan.flags = dev.ws.flags;
    plan.pdl = sw.pdl;
    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap xmap, wmap[CIQ_GEMM_GROUP_MAX];
    CIQ_TRY(wgmma_x_map(encode, x_f16, k, tokens, k_wgmma_configs[plan.config].bn, &xmap));
    wgmma_group group;
    int64_t start = 0;
    for (int i = 0; i < n; ++i) {
        const bool t1 = types[i] != T0;
        CIQ_TRY(wgmma_w_map(encode, weights[i], nb * (int64_t)(t1 ? wgmma_unit_bytes(T1) : wgmma_unit_bytes(T0)), rows[i],
                            wgmma_rs_wbox(t1 ? T1 : T0), &wmap[i]));
        if (i == 1) group.wmap1 = &wmap[1], group.tiles.start1 = (int)(start / CIQ_WGMMA_ROWS);
        if (i == 2) group.wmap2 = &wmap[2], group.tiles.start2 = (int)(start / CIQ_WGMMA_ROWS);
        if (t1 && group.tiles.t1_from == INT_MAX) group.tiles.t1_from = i;
        start += rows[i];
    }
    const float *scales = (const float *)((const uint8_t *)x_f16 + ciq_f16_scale_offset(tokens, k));
    return dispatch_wgmma<T0, true, true, T1>(xmap, wmap[0], weights[0], total, nb, scales, tokens, plan, outs, out_type,
                                              group);
}

// Whether TMA stages a weight of this type and K for the RS form (16-byte-aligned base and row pitch).
static bool wgmma_rs_stageable(ciq_type type, const void *weight, int64_t k) {
    if (type != CIQ_TYPE_Q4_K && type != CIQ_TYPE_Q5_K && type != CIQ_TYPE_Q6_K) return false;
    const int64_t nb = k / QK_K;
    const int64_t row_bytes = nb * (type == CIQ_TYPE_Q4_K ? Q4_K_BLOCK_BYTES : type == CIQ_TYPE_Q5_K ? Q5_K_BLOCK_BYTES
                                                                                                   : Q6_K_BLOCK_BYTES);
    return aligned16(weight) && row_bytes % 16 == 0;
}

ciq_status ciq_cuda_gemm_wgmma_group(int device, const ciq_wgmma_switches &switches, int n, const ciq_type *types,
                                     const void *const *weights, const int64_t *rows, int64_t k, const void *x_f16,
                                     int64_t tokens, const ciq_gemm_output *outputs, int n_outputs,
                                     ciq_out_type out_type) {
    static const char fn[] = "ciq_cuda_gemm_wgmma_group";
    if (n < 2 || n > CIQ_GEMM_GROUP_MAX) return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: %d weights (2..%d)", fn, n, CIQ_GEMM_GROUP_MAX);
    // K-quant weights only (their K a multiple of 256): the API checked K against each weight's own type, so a
    // 32-block weight's K (Gemma's 640) is no error here, only not this launch's (the weights one by one)
    if (k <= 0 || k % QK_K != 0)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: K %lld, not a multiple of %d (K-quant weights)", fn, (long long)k, QK_K);
    // the kernels built: one K-quant type (Q4_K, Q5_K, Q6_K), or Q4_K weights then Q6_K ones (8B's q, k and v)
    const ciq_type t0 = types[0], tl = types[n - 1];
    bool one_type = true, q4_then_q6 = t0 == CIQ_TYPE_Q4_K && tl == CIQ_TYPE_Q6_K;
    int64_t total = 0;
    for (int i = 0; i < n; ++i) {
        one_type = one_type && types[i] == t0;
        if (i > 0 && !(types[i] == types[i - 1] || (types[i - 1] == CIQ_TYPE_Q4_K && types[i] == CIQ_TYPE_Q6_K)))
            q4_then_q6 = false;
        if (!wgmma_rs_stageable(types[i], weights[i], k))
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: weight %d (type %d) TMA cannot stage (Q4_K, Q5_K; Q6_K with K a "
                            "multiple of 2048; 16-byte aligned)", fn, i, (int)types[i]);
        if (i + 1 < n && rows[i] % CIQ_WGMMA_ROWS != 0)
            return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: weight %d has %lld rows, not a multiple of %d", fn, i,
                            (long long)rows[i], CIQ_WGMMA_ROWS);
        total += rows[i];
    }
    if (!one_type && !q4_then_q6)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: weights of types %d .. %d (grouped: one K-quant type, or Q4_K then "
                        "Q6_K)", fn, (int)t0, (int)tl);
    CIQ_TRY(wgmma_check_size(fn, total, k, tokens));
    if (!aligned16(x_f16)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: activations must be 16-byte aligned", fn);
    const ciq_wgmma_switches sw = wgmma_plan_switches(switches);
    if (!sw.rs || sw.group == 0)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: off (GGML_CIQ_WGMMA_GROUP=0 or GGML_CIQ_WGMMA_RS=0)", fn);
    wgmma_outputs outs;
    CIQ_TRY(wgmma_make_outputs(outputs, n_outputs, total, out_type, outs));
    const int nb = (int)(k / QK_K);
    if (!one_type)
        return run_wgmma_group<CIQ_TYPE_Q4_K, CIQ_TYPE_Q6_K>(device, sw, n, types, weights, rows, total, nb, x_f16, k,
                                                            tokens, outs, out_type);
    switch (t0) {
        case CIQ_TYPE_Q4_K:
            return run_wgmma_group<CIQ_TYPE_Q4_K, CIQ_TYPE_Q4_K>(device, sw, n, types, weights, rows, total, nb, x_f16,
                                                                k, tokens, outs, out_type);
        case CIQ_TYPE_Q5_K:
            return run_wgmma_group<CIQ_TYPE_Q5_K, CIQ_TYPE_Q5_K>(device, sw, n, types, weights, rows, total, nb, x_f16,
                                                                k, tokens, outs, out_type);
        default:
            return run_wgmma_group<CIQ_TYPE_Q6_K, CIQ_TYPE_Q6_K>(device, sw, n, types, weights, rows, total, nb, x_f16,
                                                                k, tokens, outs, out_type);
    }
}

template <ciq_type T>
static ciq_status run_wgmma_glu_pair(int device, const ciq_wgmma_switches &sw, const void *gate, const void *up,
                                     int64_t rows, int64_t k, const void *x_f16, int64_t tokens,
                                     const wgmma_outputs &outs) {
    const int nb = (int)(k / QK_K);
    wgmma_device dev;
    CIQ_TRY(wgmma_device_state(device, dev));
    wgmma_plan plan = pick_plan<T, true, true>(2 * rows, tokens, nb, dev.sms, dev.l2_bytes, sw);  // the interleaved weight's
    plan.partial = dev.ws.partial, plan.flags = dev.ws.flags;
    plan.pdl = sw.pdl;
    encode_tiled_fn encode;
    if (tensor_map_encoder(&encode) != CIQ_OK) return CIQ_ERR_BACKEND;
    CUtensorMap xmap, gmap, umap;
    CIQ_TRY(wgmma_x_map(encode, x_f16, k, tokens, k_wgmma_configs[plan.config].bn, &xmap));
    const int64_t row_bytes = (int64_t)nb * wgmma_unit_bytes(T);
    CIQ_TRY(wgmma_w_map(encode, gate, row_bytes, rows, wgmma_rs_wbox(T), &gmap, CIQ_GLU_INTERLEAVE));
    CIQ_TRY(wgmma_w_map(encode, up, row_bytes, rows, wgmma_rs_wbox(T), &umap, CIQ_GLU_INTERLEAVE));
    wgmma_group group;
    group.wmap1 = &umap;
    group.tiles.glu_pair = 1;
    const float *scales = (const float *)((const uint8_t *)x_f16 + ciq_f16_scale_offset(tokens, k));
    return dispatch_wgmma<T, true, true>(xmap, gmap, gate, 2 * rows, nb, scales, tokens, plan, outs, CIQ_OUT_F32, group);
}

ciq_status ciq_cuda_gemm_wgmma_glu_pair(int device, const ciq_wgmma_switches &switches, ciq_type type,
                                        const void *gate, const void *up, int64_t rows, int64_t k, const void *x_f16,
                                        int64_t tokens, bool gelu, float *out) {
    static const char fn[] = "ciq_cuda_gemm_wgmma_glu_pair";
    if (k <= 0 || k % QK_K != 0)  // as in ciq_cuda_gemm_wgmma_group: the two GEMMs and the GLU instead
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: K %lld, not a multiple of %d (K-quant weights)", fn, (long long)k, QK_K);
    if (rows % CIQ_GLU_INTERLEAVE != 0)
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: %lld rows, not a multiple of %d", fn, (long long)rows,
                        CIQ_GLU_INTERLEAVE);
    if (!wgmma_rs_stageable(type, gate, k) || !wgmma_rs_stageable(type, up, k))
        return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: weights of type %d TMA cannot stage (Q4_K, Q5_K; Q6_K with K a "
                        "multiple of 2048; 16-byte aligned)", fn, (int)type);
    CIQ_TRY(wgmma_check_size(fn, 2 * rows, k, tokens));
    if (!aligned16(x_f16)) return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "%s: activations must be 16-byte aligned", fn);
    const ciq_wgmma_switches sw = wgmma_plan_switches(switches);
    if (!sw.rs) return ciq_fail(CIQ_ERR_UNSUPPORTED, "%s: off (GGML_CIQ_WGMMA_RS=0)", fn);
    wgmma_outputs outs{};
    outs.n = 1;
    outs.glu = gelu ? 2 : 1;
    outs.vec = aligned16(out);
    outs.row_end[0] = 2 * rows;
    outs.out[0] = out;
    switch (type) {
        case CIQ_TYPE_Q4_K: return run_wgmma_glu_pair<CIQ_TYPE_Q4_K>(device, sw, gate, up, rows, k, x_f16, tokens, outs);
        case CIQ_TYPE_Q5_K: return run_wgmma_glu_pair<CIQ_TYPE_Q5_K>(device, sw, gate, up, rows, k, x_f16, tokens, outs);
        default: return run_wgmma_glu_pair<CIQ_TYPE_Q6_K>(device, sw, gate, up, rows, k, x_f16, tokens, outs);
    }
}

#else  // HIP: no wgmma

ciq_status ciq_cuda_gemm_wgmma(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t, const void *,
                               int64_t, void *, ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_outputs(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t,
                                       const void *, int64_t, const ciq_gemm_output *, int, ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_glu(int, const ciq_wgmma_switches &, ciq_type, const void *, int64_t, int64_t,
                                   const void *, int64_t, bool, float *) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_group(int, const ciq_wgmma_switches &, int, const ciq_type *, const void *const *,
                                     const int64_t *, int64_t, const void *, int64_t, const ciq_gemm_output *, int,
                                     ciq_out_type) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
ciq_status ciq_cuda_gemm_wgmma_glu_pair(int, const ciq_wgmma_switches &, ciq_type, const void *, const void *, int64_t,
                                        int64_t, const void *, int64_t, bool, float *) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "ciq_cuda_gemm_wgmma: the wgmma kernel is CUDA-only");
}
#endif
