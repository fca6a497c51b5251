// The dense GEMM of few rows (a denoising step's 32 tokens, or fewer): Y[m, n] = X[m, k] . W[n, k]^T
// in BF16 with F32 sums, for M <= 32. Such a GEMM is the weight matrix streamed once, so the
// kernel is built to keep many weight bytes in flight: each warp owns 16 output columns over the
// whole of K (never split: every output stays one chain), a CTA of WARPS warps shares one copy of
// the activation rows per stage, and 6 or 8 stages of 64 columns are in flight. The weight copies
// of the first stages are issued before `pdl_enter` (weights are never written by a forward's
// kernels), so under programmatic dependent launch they stream while the kernel before still runs.
//
// Every output is the sum over K in ascending 16-column steps of one mma.m16n8k16 each, the
// activation rows as the A operand and the weight rows as the B operand, starting from zero:
// the products and the order of `dense_gemm_m16/m64/m128` in kernels/moe.cu (whose wmma tiles
// run the same instruction per step), so a row's bits are the same whichever of them runs it.
#include "common.cuh"

namespace minnow_dense {
constexpr int BK = 64;        // K columns per stage
constexpr int LDS = BK + 8;   // BF16 pitch of a staged row (ldmatrix rows fall on distinct banks)
constexpr int TOKENS = 32;    // rows the kernel holds (two m16 fragments)

template <int WARPS>
struct Skinny {
    // Stages in flight: 8 where they fit the 96 KB the module asks for (so every GPU minnow runs
    // on has them), 6 for the widest CTA.
    static constexpr int STAGES = WARPS == 4 ? 6 : 8;
    static constexpr int THREADS = 32 * WARPS;
    static constexpr int COLS = 16 * WARPS;  // output columns of a CTA
    static constexpr int X_ELEMS = TOKENS * LDS;
    static constexpr int STAGE_ELEMS = (TOKENS + COLS) * LDS;
    static constexpr int SMEM_BYTES = STAGES * STAGE_ELEMS * 2;
    static_assert(SMEM_BYTES <= 96 * 1024, "the module's shared-memory opt-in");
    // 16-byte copies of one stage per thread: activation rows (all TOKENS, whether or not M
    // reaches them: rows past M are skipped) and the CTA's weight rows.
    static constexpr int X_COPIES = TOKENS * (BK / 8) / THREADS;
    static constexpr int W_COPIES = COLS * (BK / 8) / THREADS;
    static_assert(X_COPIES * THREADS == TOKENS * (BK / 8), "activations: whole copies");
    static_assert(W_COPIES * THREADS == COLS * (BK / 8), "weights: whole copies");
};

using minnow_smem::ldmatrix_x4;
using minnow_smem::smem_addr;

// grid = N / COLS, block = THREADS, dynamic shared memory = SMEM_BYTES. Requires M <= TOKENS,
// N % COLS == 0 and K % BK == 0 (ops::skinny_dense_fits).
template <int WARPS>
__device__ void skinny_gemm(const bf16* __restrict__ X, const bf16* __restrict__ W, bf16* __restrict__ Y, int M,
                            int N, int K) {
    using S = Skinny<WARPS>;
    constexpr int STAGES = S::STAGES;
    extern __shared__ __align__(128) bf16 smem_rows[];
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int n0 = blockIdx.x * S::COLS, stages_k = K / BK;
    // A launch with less shared memory than the stages need (ops::skinny_dense_smem_bytes out of
    // step with Skinny) fails loudly instead of overwriting its neighbour's memory.
    unsigned dynamic_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dynamic_bytes));
    if (dynamic_bytes < S::SMEM_BYTES) __trap();

    // This thread's copies: source rows and their place in a stage, the same in every stage but
    // for the K offset. Chunk c of a stage: row c / 8, columns (c % 8) x 8.
    const bf16* w_src[S::W_COPIES];
    int w_dst[S::W_COPIES];
#pragma unroll
    for (int i = 0; i < S::W_COPIES; ++i) {
        const int c = tid + i * S::THREADS, r = c / 8, col = (c % 8) * 8;
        w_src[i] = W + (size_t)(n0 + r) * K + col;
        w_dst[i] = S::X_ELEMS + r * LDS + col;
    }
    const bf16* x_src[S::X_COPIES];
    int x_dst[S::X_COPIES];
    bool x_ok[S::X_COPIES];
#pragma unroll
    for (int i = 0; i < S::X_COPIES; ++i) {
        const int c = tid + i * S::THREADS, r = c / 8, col = (c % 8) * 8;
        x_ok[i] = r < M;
        x_src[i] = X + (size_t)(x_ok[i] ? r : 0) * K + col;
        x_dst[i] = r * LDS + col;
    }
    auto load_weights = [&](int st) {
        bf16* base = smem_rows + (st % STAGES) * S::STAGE_ELEMS;
#pragma unroll
        for (int i = 0; i < S::W_COPIES; ++i) cp_async16(base + w_dst[i], w_src[i] + st * BK, true);
    };
    auto load_rows = [&](int st) {
        bf16* base = smem_rows + (st % STAGES) * S::STAGE_ELEMS;
#pragma unroll
        for (int i = 0; i < S::X_COPIES; ++i)
            if (x_ok[i]) cp_async16(base + x_dst[i], x_src[i] + st * BK, true);
    };

    // The first stages' weights before the wait for the kernel before; their rows after it. One
    // commit group per stage (the first holds every early weight copy too), so waiting for stage
    // s's group also covers its weights.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s)
        if (s < stages_k) load_weights(s);
    pdl_enter();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < stages_k) load_rows(s);
        cp_async_commit();
    }

    // acc[mm][j]: rows 16 mm + g (and + 8), columns n0 + 16 warp + 8 j + 2 t4 (and + 1).
    float acc[2][2][4];
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
        for (int j = 0; j < 2; ++j) acc[mm][j][0] = acc[mm][j][1] = acc[mm][j][2] = acc[mm][j][3] = 0.f;
    const bool two = M > 16;  // the second 16 rows hold a row
    // ldmatrix rows: A (activations) lanes 0-15 rows 0-15 of the low 8 columns, lanes 16-31 the
    // high 8; B (the warp's 16 weight rows) lanes 0-7 / 8-15 rows 0-7 low / high columns, lanes
    // 16-31 rows 8-15: b[0], b[1] the first n8 fragment, b[2], b[3] the second.
    const int a_off = (lane & 15) * LDS + (lane >> 4) * 8;
    const int b_off = S::X_ELEMS + (warp * 16 + ((lane >> 4) << 3) + (lane & 7)) * LDS + ((lane >> 3) & 1) * 8;

    for (int st = 0; st < stages_k; ++st) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = st + STAGES - 1;
        if (next < stages_k) {
            load_weights(next);
            load_rows(next);
        }
        cp_async_commit();
        const bf16* base = smem_rows + (st % STAGES) * S::STAGE_ELEMS;
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned b[4], a[4];
            ldmatrix_x4(b, smem_addr(base + b_off + kk));
            ldmatrix_x4(a, smem_addr(base + a_off + kk));
            mma16816(acc[0][0], a, b[0], b[1]);
            mma16816(acc[0][1], a, b[2], b[3]);
            if (two) {
                ldmatrix_x4(a, smem_addr(base + a_off + 16 * LDS + kk));
                mma16816(acc[1][0], a, b[0], b[1]);
                mma16816(acc[1][1], a, b[2], b[3]);
            }
        }
    }
    cp_async_wait<0>();

    const int g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int mm = 0; mm < 2; ++mm)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = mm * 16 + g + 8 * h, col = n0 + warp * 16 + j * 8 + 2 * t4;
                if (row < M)
                    *reinterpret_cast<__nv_bfloat162*>(Y + (size_t)row * N + col) =
                        __floats2bfloat162_rn(acc[mm][j][2 * h], acc[mm][j][2 * h + 1]);
            }
}
}  // namespace minnow_dense

#define SKINNY_ENTRY(NAME, WARPS)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS)                                             \
        NAME(const bf16* X, const bf16* W, bf16* Y, int M, int N, int K) {                                \
        minnow_dense::skinny_gemm<WARPS>(X, W, Y, M, N, K);                                              \
    }
// 16, 32 and 64 output columns per CTA: how many CTAs share the weights against how many share
// one copy of the rows (Tuning::dense_skinny_warps).
SKINNY_ENTRY(dense_gemm_skinny_w1, 1)
SKINNY_ENTRY(dense_gemm_skinny_w2, 2)
SKINNY_ENTRY(dense_gemm_skinny_w4, 4)
