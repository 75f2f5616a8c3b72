// convert_f16.cu - activations into the f16 layout the wgmma GEMM reads (f16 semantics, ggml_ciq.h):
//   xh[t][k] = f16(x[t][k] * 2^-e_t), then at ciq_f16_scale_offset float scale[t] = 2^e_t, with e_t putting the
//   token's largest |x| in [2^14, 2^15) (no f16 overflow, 11-bit mantissa).
// One CTA of 256 threads per token. The kernel releases a programmatic dependent launch of the GEMM after it.
// ciq_glu_activations' fused form reads gate and up and converts act(gate) * up (ciq_glu_value, the host order);
// ciq_rms_norm_activations' is in ops.cu (the norm's row kernels). The scale: ciq_f16_up_scale (common.cuh).
#include "wgmma_ptx.cuh"

#if !defined(GGML_CIQ_HIP)
// Activations -> f16 layout: one CTA per token finds amax, picks 2^e with amax * 2^-e in [2^14, 2^15) and writes
// f16(x * 2^-e) and scale_t = 2^e. NV > 0: the row is read once, NV float4 per thread held in registers (K <= 1024 NV,
// x 16-byte aligned); NV == 0: any even K and alignment, the row is read twice.
// GLU: x = ciq_glu_value(gate, up) (ciq_glu_activations: the GLU fused in, no float32 intermediate); the same
// values as ciq_glu then this conversion.
template <int NV, bool GLU>
__global__ void __launch_bounds__(256) convert_f16_kernel(const float *__restrict__ x, const float *__restrict__ up,
                                                          bool gelu, int64_t k, __half *__restrict__ xh,
                                                          float *__restrict__ scales) {
    ciq_launch_dependents();  // the GEMM after it may start (it waits for this grid)
    const int64_t tok = blockIdx.x;
    const float *xr = x + tok * k;
    const float *ur = GLU ? up + tok * k : nullptr;
    __half *hr = xh + tok * k;
    auto value = [&](int64_t c) { return GLU ? ciq_glu_value(gelu, xr[c], ur[c]) : xr[c]; };
    if constexpr (NV > 0) {
        float4 v[NV];
        float amax = 0.0f;
#pragma unroll
        for (int n = 0; n < NV; ++n) {
            const int64_t c = 4 * (threadIdx.x + 256 * n);
            v[n] = c < k ? __ldg((const float4 *)(xr + c)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (GLU && c < k) {
                const float4 u = __ldg((const float4 *)(ur + c));
                v[n] = make_float4(ciq_glu_value(gelu, v[n].x, u.x), ciq_glu_value(gelu, v[n].y, u.y),
                                   ciq_glu_value(gelu, v[n].z, u.z), ciq_glu_value(gelu, v[n].w, u.w));
            }
            amax = fmaxf(amax, fmaxf(fmaxf(fabsf(v[n].x), fabsf(v[n].y)), fmaxf(fabsf(v[n].z), fabsf(v[n].w))));
        }
        const float upscale = ciq_f16_up_scale(ciq_block_max(amax), threadIdx.x == 0 ? scales + tok : nullptr);
#pragma unroll
        for (int n = 0; n < NV; ++n) {
            const int64_t c = 4 * (threadIdx.x + 256 * n);
            if (c < k)
                *(uint2 *)(hr + c) = make_uint2(h2u(__floats2half2_rn(v[n].x * upscale, v[n].y * upscale)),
                                                h2u(__floats2half2_rn(v[n].z * upscale, v[n].w * upscale)));
        }
    } else {  // the values are computed twice (the GLU's: the same both times)
        float amax = 0.0f;
        for (int64_t c = threadIdx.x; c < k; c += 256) amax = fmaxf(amax, fabsf(value(c)));
        const float upscale = ciq_f16_up_scale(ciq_block_max(amax), threadIdx.x == 0 ? scales + tok : nullptr);
        for (int64_t c = 2 * threadIdx.x; c < k; c += 512)
            *(uint32_t *)(hr + c) = h2u(__floats2half2_rn(value(c) * upscale, value(c + 1) * upscale));
    }
}

// x (and up, with GLU) [tokens][k] -> the f16 layout: NV float4 per thread in registers where the rows are 16-byte
// aligned and K <= 16384, else the two-pass kernel.
template <bool GLU>
ciq_status launch_convert_f16(const float *x, const float *up, bool gelu, void *out, int64_t tokens, int64_t k) {
    __half *xh = (__half *)out;
    float *scales = (float *)((uint8_t *)out + ciq_f16_scale_offset(tokens, k));
    const int64_t per_thread = (k + 1023) / 1024;  // float4 per thread when the row stays in registers
    const unsigned grid = (unsigned)tokens;
    const bool aligned = ((uintptr_t)x | (uintptr_t)up) % 16 == 0 && k % 4 == 0;
    if (!aligned || per_thread > 16) convert_f16_kernel<0, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    else if (per_thread <= 1) convert_f16_kernel<1, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    else if (per_thread <= 2) convert_f16_kernel<2, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    else if (per_thread <= 4) convert_f16_kernel<4, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    else if (per_thread <= 8) convert_f16_kernel<8, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    else convert_f16_kernel<16, GLU><<<grid, 256, 0, ciq_stream()>>>(x, up, gelu, k, xh, scales);
    CIQ_CUDA_LAUNCH_CHECK(GLU ? "glu + convert_f16" : "convert_f16");
    return CIQ_OK;
}

ciq_status ciq_cuda_convert_f16(const float *x, void *out, int64_t tokens, int64_t k) {
    return launch_convert_f16<false>(x, nullptr, false, out, tokens, k);
}

ciq_status ciq_cuda_glu_convert_f16(bool gelu, const float *gate, const float *up, void *out, int64_t tokens, int64_t k) {
    return launch_convert_f16<true>(gate, up, gelu, out, tokens, k);
}

#else  // HIP: no f16 semantics

ciq_status ciq_cuda_convert_f16(const float *, void *, int64_t, int64_t) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "f16 semantics (the wgmma kernel) are CUDA-only");
}
ciq_status ciq_cuda_glu_convert_f16(bool, const float *, const float *, void *, int64_t, int64_t) {
    return ciq_fail(CIQ_ERR_UNSUPPORTED, "f16 semantics (the wgmma kernel) are CUDA-only");
}
#endif
