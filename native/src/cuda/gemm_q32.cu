// gemm_q32.cu - the 32-value block types (Q4_0 / Q5_0 / Q8_0, Q4_1 / Q5_1) in llama.cpp CUDA MMQ's semantics (the q32
// variant of ciq_gemm).
//
// The values: weights as MMQ's load_tiles_q{4,5,8}_0 / q{4,5}_1 leave them (int8: Q4_0 q-8, Q5_0 q-16, Q8_0 q; Q4_1
// q 0..15, Q5_1 q 0..31), the block's fp16 d (and m), activations as block_q8_1_mmq (q8_1 per 32 values; D4: float
// d8; DS4 (Q4_0, Q4_1, Q5_1): half2 {d8, s8}, s8 the fp16 sum of the block's floats). out[t][r] accumulates, block by
// block in K order:
//   Q4_0 / Q5_0 / Q8_0: acc = fma(float(isum) * d_w, d8, acc)          (vec_dot_q8_0_q8_1_mma's `sum += C*dA*dB`)
//   Q4_1 / Q5_1:        acc = fma(d_w * d8, float(isum), acc); acc = fma(m_w, s8, acc)   (vec_dot_q8_1_q8_1_mma's
//                       `sum += dmA.x*dsB.x*C; sum += dmA.y*dsB.y`)
// as nvcc contracts them. isum, the block's integer dot product, is exact.
// K is any multiple of 32: the activations' last 128-value block is zero-padded (as llama.cpp pads src1), and blocks
// past K are not summed (MMQ sums them as exact zeros: d8 = 0 there).
//
// One CTA (256 threads) computes a 64-row x 32-token tile, walking K 128 values (4 blocks, one q8_1-mmq block per
// token) at a time: thread (row, block) of the 64 x 4 decodes its weight block into wq, all threads copy the 32
// tokens' activation blocks into xq/xd, barrier, dot products, barrier. Thread tid owns rows tid%16 + 16i (i < 4)
// and tokens tid/16 + 16j (j < 2). Row strides of 33 words keep the 16 rows a warp reads on distinct banks.
//
// MMQ's stream-k seams (mmq_stream_k.cuh): each thread finds the seams of its two tokens' MMQ tiles (its rows share
// one), restarts its sums there (keeping up to Q32_PARTIALS earlier segments; a tile with more runs in one pass) and
// adds them as MMQ's fixup does.
#include "common.cuh"
#include "mmq_stream_k.cuh"

namespace {

constexpr int Q32_ROWS = 64, Q32_TOKENS = 32, Q32_THREADS = 256, Q32_STRIDE = 33;  // STRIDE: words per staged row
constexpr int Q32_PARTIALS = 16;  // segments before a tile's last a thread keeps: every K <= 4096 (more: that tile in
                                  // one pass, the last bits then ours)

__device__ __forceinline__ uint32_t bytes4(uint32_t v0, uint32_t v1, uint32_t v2, uint32_t v3) {
    return (v0 & 0xFF) | (v1 & 0xFF) << 8 | (v2 & 0xFF) << 16 | (v3 & 0xFF) << 24;
}

// ggml type ids of the 32-value block types this file runs
constexpr int Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8;
constexpr __host__ __device__ bool has_min(int type) { return type == Q4_1 || type == Q5_1; }  // d and m: value = q * d + m
constexpr __host__ __device__ int block_bytes_of(int type) {
    return type == Q4_0 ? Q4_0_BLOCK_BYTES : type == Q5_0 ? Q5_0_BLOCK_BYTES : type == Q4_1 ? Q4_1_BLOCK_BYTES
         : type == Q5_1 ? Q5_1_BLOCK_BYTES : Q8_0_BLOCK_BYTES;
}

// Block kb of one row -> 8 words of int8 values (value 4w + b in byte b of word w), its scale d and (Q4_1, Q5_1) its
// m. Blocks are only 2-byte aligned (18, 22 and 34 bytes), so they are read as 16-bit words. Layouts (16-bit words):
// Q4_0 {d, qs[16]}, Q5_0 {d, qh[4], qs[16]}, Q4_1 {d, m, qs[16]}, Q5_1 {d, m, qh[4], qs[16]}, Q8_0 {d, qs[32]}.
template <int TYPE>
__device__ __forceinline__ void decode_block(const uint16_t *__restrict__ blk, uint32_t (&q)[8], float *d, float *m) {
    *d = ciq_half_to_float(blk[0]);
    if constexpr (has_min(TYPE)) *m = ciq_half_to_float(blk[1]);
    if constexpr (TYPE == Q8_0) {  // Q8_0: d, qs[32]
#pragma unroll
        for (int w = 0; w < 8; ++w) q[w] = blk[1 + 2 * w] | (uint32_t)blk[2 + 2 * w] << 16;
    } else {
        constexpr bool five = TYPE == Q5_0 || TYPE == Q5_1;
        constexpr int qh_at = has_min(TYPE) ? 2 : 1;  // in 16-bit words
        uint32_t qs[4];  // the 16 bytes of 4-bit values: value j low nibble of byte j, value j + 16 high nibble
        const uint16_t *qs16 = blk + qh_at + (five ? 2 : 0);
#pragma unroll
        for (int w = 0; w < 4; ++w) qs[w] = qs16[2 * w] | (uint32_t)qs16[2 * w + 1] << 16;
        const uint32_t qh = five ? (blk[qh_at] | (uint32_t)blk[qh_at + 1] << 16) : 0;  // bit j is value j's 5th bit
        const int offset = TYPE == Q5_0 ? 16 : TYPE == Q4_0 ? 8 : 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            int v[4];
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int j = 4 * w + b;  // value index in the block
                const int nibble = (qs[(j % 16) / 4] >> (8 * (j % 4) + (j < 16 ? 0 : 4))) & 0xF;
                v[b] = (nibble | (int)((qh >> j) & 1) << 4) - offset;
            }
            q[w] = bytes4(v[0], v[1], v[2], v[3]);
        }
    }
}

template <int TYPE>
__global__ void __launch_bounds__(Q32_THREADS)
gemm_q32_kernel(const uint8_t *__restrict__ w, int64_t rows, int64_t k, const uint8_t *__restrict__ xq,
                int64_t tokens, float *__restrict__ out, MmqStreamK mmq) {
    constexpr int block_bytes = block_bytes_of(TYPE);
    constexpr bool MIN = has_min(TYPE);
    __shared__ uint32_t wq[Q32_ROWS * Q32_STRIDE];
    __shared__ uint32_t xs[Q32_TOKENS * Q32_STRIDE];
    __shared__ float wd[Q32_ROWS][4], xd[Q32_TOKENS][4];
    __shared__ float wm[MIN ? Q32_ROWS : 1][4], xsum[MIN ? Q32_TOKENS : 1][4];  // Q4_1 / Q5_1: m, s8

    const int tid = threadIdx.x, rg = tid % 16, tg = tid / 16;
    const int64_t row0 = (int64_t)blockIdx.x * Q32_ROWS, t0 = (int64_t)blockIdx.y * Q32_TOKENS;
    const int64_t nb = k / 32, row_bytes = nb * block_bytes;
    const int stage_row = tid / 4, stage_block = tid % 4;
    const uint8_t *w_row = w + min(row0 + stage_row, rows - 1) * row_bytes;  // rows past the end re-read the last

    float acc[4][2] = {};
    // MMQ's seams for this thread's two tokens (its rows share one 128-row MMQ tile): restart at seam[j][next[j]].
    int seam[2][Q32_PARTIALS], seams[2], next[2] = {0, 0};
    float part[2][Q32_PARTIALS][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int64_t t = min(t0 + tg + 16 * j, tokens - 1);
        seams[j] = mmq.split() ? max(0, mmq_tile_seams(mmq, (row0 / MMQ_ROWS) * mmq.ntx + t / mmq.J, seam[j],
                                                       Q32_PARTIALS))
                               : 0;
    }
    for (int64_t s = 0; s < (nb + 3) / 4; ++s) {
        const int blocks = (int)min((int64_t)4, nb - 4 * s);  // the last step may hold fewer than 4 (K % 128 != 0)
        if (s % 2 == 0) {  // seams fall on MMQ's 8-block iterations, i.e. every other step of 4 blocks
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                if (next[j] < seams[j] && 4 * s == seam[j][next[j]]) {
#pragma unroll
                    for (int p = 0; p < Q32_PARTIALS; ++p) {
                        if (p == next[j]) {
#pragma unroll
                            for (int i = 0; i < 4; ++i) part[j][p][i] = acc[i][j];
                        }
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[i][j] = 0.0f;
                    ++next[j];
                }
            }
        }
        if (stage_block < blocks) {
            uint32_t q[8];
            decode_block<TYPE>((const uint16_t *)(w_row + (4 * s + stage_block) * block_bytes), q,
                               &wd[stage_row][stage_block], &wm[MIN ? stage_row : 0][stage_block]);
#pragma unroll
            for (int i = 0; i < 8; ++i) wq[stage_row * Q32_STRIDE + 8 * stage_block + i] = q[i];
        }
        for (int i = tid; i < Q32_TOKENS * 36; i += Q32_THREADS) {  // 36 words per block_q8_1_mmq
            const int tok = i / 36, word = i % 36;
            const uint32_t v = t0 + tok < tokens
                                   ? ((const uint32_t *)(xq + ((s * tokens) + t0 + tok) * Q8_1_MMQ_BLOCK_BYTES))[word]
                                   : 0u;
            if (word >= 4) {
                xs[tok * Q32_STRIDE + word - 4] = v;
            } else {  // D4: float d8; DS4 (Q4_0, Q4_1, Q5_1): half2 {d8, s8}, as MMQ's __half22float2 reads it
                const bool ds4 = TYPE == Q4_0 || MIN;
                xd[tok][word] = ds4 ? ciq_half_to_float((uint16_t)(v & 0xFFFF)) : __uint_as_float(v);
                if constexpr (MIN) xsum[tok][word] = ciq_half_to_float((uint16_t)(v >> 16));
            }
        }
        __syncthreads();
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            if (b >= blocks) break;  // past K: MMQ adds exact zeros there
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int r = rg + 16 * i;
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int t = tg + 16 * j;
                    int isum = 0;
#pragma unroll
                    for (int c = 0; c < 8; ++c) {
                        isum = ciq_dot4((int)wq[r * Q32_STRIDE + 8 * b + c], (int)xs[t * Q32_STRIDE + 8 * b + c], isum);
                    }
                    if constexpr (MIN) {
                        acc[i][j] = __fmaf_rn(__fmul_rn(wd[r][b], xd[t][b]), (float)isum, acc[i][j]);
                        acc[i][j] = __fmaf_rn(wm[r][b], xsum[t][b], acc[i][j]);
                    } else {
                        acc[i][j] = __fmaf_rn(__fmul_rn((float)isum, wd[r][b]), xd[t][b], acc[i][j]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const int64_t t = t0 + tg + 16 * j;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            // MMQ's fixup: the last segment (acc) plus the earlier ones summed from the nearest back to the first.
            float earlier = 0.0f;
#pragma unroll
            for (int p = Q32_PARTIALS - 1; p >= 0; --p) {
                if (p < next[j]) earlier = __fadd_rn(earlier, part[j][p][i]);
            }
            const int64_t r = row0 + rg + 16 * i;
            if (t < tokens && r < rows) out[t * rows + r] = next[j] ? __fadd_rn(acc[i][j], earlier) : acc[i][j];
        }
    }
}

template <int TYPE>
void launch_q32(dim3 grid, const uint8_t *w, int64_t rows, int64_t k, const uint8_t *xq, int64_t tokens, float *out,
                const MmqStreamK &mmq) {
    gemm_q32_kernel<TYPE><<<grid, Q32_THREADS, 0, ciq_stream()>>>(w, rows, k, xq, tokens, out, mmq);
}

}  // namespace

ciq_status ciq_cuda_gemm_q32(int type, const void *weight, int64_t rows, int64_t k, const void *x_q8_1_mmq,
                             int64_t tokens, float *out) {
    const dim3 grid((unsigned)((rows + Q32_ROWS - 1) / Q32_ROWS), (unsigned)((tokens + Q32_TOKENS - 1) / Q32_TOKENS));
    const uint8_t *w = (const uint8_t *)weight, *xq = (const uint8_t *)x_q8_1_mmq;
    int device, sms;
    const ciq_status status = ciq_current_gpu_sms("gemm_q32", &device, &sms);
    if (status != CIQ_OK) return status;
    const MmqStreamK mmq = mmq_stream_k(rows, k / 32, 8, tokens, sms);  // 8 blocks of 32 values an iteration
    switch (type) {
        case Q4_0: launch_q32<Q4_0>(grid, w, rows, k, xq, tokens, out, mmq); break;
        case Q5_0: launch_q32<Q5_0>(grid, w, rows, k, xq, tokens, out, mmq); break;
        case Q4_1: launch_q32<Q4_1>(grid, w, rows, k, xq, tokens, out, mmq); break;
        case Q5_1: launch_q32<Q5_1>(grid, w, rows, k, xq, tokens, out, mmq); break;
        case Q8_0: launch_q32<Q8_0>(grid, w, rows, k, xq, tokens, out, mmq); break;
        default: return ciq_fail(CIQ_ERR_INVALID_ARGUMENT, "gemm_q32: type %d is not a 32-value block type", type);
    }
    CIQ_CUDA_LAUNCH_CHECK("gemm_q32");
    return CIQ_OK;
}
