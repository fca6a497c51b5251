// Shared helpers of minnow's CUDA kernels. Every kernel file includes this header, so its text is
// part of each kernel's source hash (see crates/minnow-runtime/src/cuda/ptx.rs).
#pragma once
#include <cuda_bf16.h>

typedef __nv_bfloat16 bf16;

// Programmatic dependent launch (Hopper and newer; compiled out of the sm_80 PTX). minnow launches
// every kernel of a forward with the programmatic-serialization attribute on such GPUs, so a
// kernel's CTAs may start while the kernel before it is still running. The rule every kernel
// follows, which makes that safe:
//   - `pdl_enter()` comes before the first read of anything an earlier kernel wrote and before
//     the first global write; it waits until the previous kernel has finished and its writes are
//     visible, then lets the next kernel start launching.
//   - Before it, a kernel may only touch memory no kernel of the forward writes (weights).
// Without the launch attribute (older GPUs, MINNOW_PDL=0, cuBLAS neighbours) both are no-ops.
__device__ __forceinline__ void pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;\n" :::);
#endif
}

// A CTA barrier over `threads` threads (a multiple of 32) on hardware barrier `id` (1-15; 0 is
// __syncthreads'), for warps that may have diverged just before it (a lane-0 arrive, a row
// guard). Why the __syncwarp: bar.sync counts a whole warp each time one of its diverged parts
// executes it, so a warp arriving in two parts would release the barrier early. The memory
// clobber keeps the compiler from moving shared-memory reads and writes across it.
__device__ __forceinline__ void named_barrier_sync(unsigned id, unsigned threads) {
    __syncwarp();
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float to_f32(bf16 x) { return __bfloat162float(x); }
// Round-to-nearest-even, like PyTorch's BF16 casts.
__device__ __forceinline__ bf16 to_bf16(float x) { return __float2bfloat16_rn(x); }
// A BF16 x BF16 product as PyTorch computes it: exact in F32, rounded once.
__device__ __forceinline__ bf16 mul_bf16(bf16 a, bf16 b) { return to_bf16(to_f32(a) * to_f32(b)); }
// The SwiGLU activation of one column from the BF16 gate and up outputs (as F32 values):
// BF16( BF16(silu(gate)) * up ). silu_mul and the pool GEMM's gated epilogue both use it, which
// keeps them bit-identical.
__device__ __forceinline__ bf16 silu_mul_bf16(float gate, float up) {
    return mul_bf16(to_bf16(gate / (1.f + expf(-gate))), to_bf16(up));
}

// A BF16 value's place in the order "larger value first, NaN below every number, -0 equal to
// +0" as an unsigned 16-bit key (larger value, larger key; NaN is key 0, -inf 0x7f).
__device__ __forceinline__ unsigned bf16_order_key(unsigned bits) {
    if ((bits & 0x7fffu) > 0x7f80u) return 0u;  // NaN: below -inf (key 0x7f)
    if (bits == 0x8000u) bits = 0u;              // -0 is +0
    return (bits & 0x8000u) ? (~bits & 0xffffu) : (bits | 0x8000u);
}

// The 8 BF16 logits (bits) at ids 8v .. 8v + 7 of a row of `vocab` ids; ids past the row read as
// NaN (order key 0). One 16-byte load where vocab % 8 == 0 (rows then start 16-byte aligned).
__device__ __forceinline__ void bf16_bits8(const unsigned short* row, int vocab, int v, unsigned (&bits)[8]) {
    const int id0 = 8 * v;
    if ((vocab & 7) == 0 && id0 + 8 <= vocab) {
        const uint4 q = *reinterpret_cast<const uint4*>(row + id0);
        const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            bits[2 * e] = w[e] & 0xffffu;
            bits[2 * e + 1] = w[e] >> 16;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) bits[e] = id0 + e < vocab ? (unsigned)row[id0 + e] : 0x7fc0u;
    }
}

// hist[bin] += 1 for every lane of the warp that counts (all 32 lanes call it, bin < 256): one
// shared atomic per distinct bin of the warp, since logits crowd into a few bins of their keys.
__device__ __forceinline__ void hist_count(unsigned* hist, unsigned bin, bool counts, int lane) {
    const unsigned peers = __match_any_sync(0xffffffffu, counts ? bin : 0x100u);
    if (counts && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole CTA (blockDim.x a multiple of 32, at most 1024). `scratch` holds 32 floats.
// Every thread gets the result.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = lane < nwarps ? scratch[lane] : 0.f;
    return warp_sum(total);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(total);
}

// 16-byte asynchronous global -> shared copy (Ampere and newer); `valid` false fills the 16 bytes
// with zeros instead of reading.
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    const int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// D += A . B on tensor cores: one m16n8k16 BF16 product with F32 accumulation (the fragment
// layouts of the PTX ISA's mma.m16n8k16; A row-major, B column-major).
__device__ __forceinline__ void mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory addressing of the tensor-core kernels on every supported architecture (sm_80
// and newer): a pointer's shared-window address, the 128-byte swizzle that TMA boxes and the
// tiled router's cp.async slices are written with, and ldmatrix over it.
namespace minnow_smem {
__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
// Byte offset of the 16-byte chunk `chunk` of row `row` in a box written with the 128-byte swizzle
// (rows of 128 bytes; the chunk index is XORed with the row's position in its 8-row atom).
__device__ __forceinline__ unsigned swizzled(int row, int chunk) { return row * 128 + ((chunk ^ (row & 7)) << 4); }
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
}  // namespace minnow_smem

// Hopper's asynchronous copies (kernels/pool_gemm.cu, kernels/expert_wgmma.cu): mbarriers, boxes
// of a 2D tensor map copied by the Tensor Memory Accelerator, and the 128-byte swizzle they write.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
namespace minnow_tma {
using minnow_smem::ldmatrix_x4;
using minnow_smem::smem_addr;
using minnow_smem::swizzled;

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
// Makes the barriers one thread initialised visible to the other threads and to the copy engine
// (TMA completes its bytes through the async proxy), before the __syncthreads that follows.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Thread 0 initialises `stages` pairs of stage barriers, full0 + 8 s (a stage's bytes landed:
// `full_arrivals` per phase) and empty0 + 8 s (its readers are done: `empty_arrivals`), fenced
// for the copy engine; then the whole CTA synchronises.
__device__ __forceinline__ void init_stage_barriers(unsigned full0, unsigned empty0, int stages, unsigned full_arrivals,
                                                    unsigned empty_arrivals) {
    if (threadIdx.x == 0) {
        for (int s = 0; s < stages; ++s) {
            mbar_init(full0 + 8 * s, full_arrivals);
            mbar_init(empty0 + 8 * s, empty_arrivals);
        }
        mbar_init_fence();
    }
    __syncthreads();
}
// Orders this thread's shared-memory accesses in the generic proxy (ld/st, ldmatrix, and the rows
// cp.async landed, once a barrier wait has seen them) with its later ones in the async proxy (a
// TMA copy's writes, wgmma's operand reads). Consumers that read a stage with ldmatrix call it
// before releasing the stage to the next TMA fill; consumers whose wgmma reads rows that cp.async
// wrote call it after the stage's `full` wait.
__device__ __forceinline__ void fence_async_proxy_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    unsigned done = 0;
    while (!done) {
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    }
}
// This thread's earlier cp.async copies arrive on `bar` when they land (counted in its arrivals).
__device__ __forceinline__ void cp_async_arrive_noinc(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Before the first copy through a tensor map in global memory, the thread that issues the copies
// acquires the map for the async proxy. Why: the copy engine caches maps by address, and the host
// writes them with ordinary copies; a map uploaded where another map lived before (a freed buffer
// reused, a map re-pointed in place) could otherwise be read stale, copying the wrong tensor.
__device__ __forceinline__ void tensormap_acquire(const void* map) {
    asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(map) : "memory");
}
// One box of a 2D tensor map (in global memory) at columns c0.., rows c1.. into shared memory;
// completion counts its bytes on `bar`.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const void* map, int c0, int c1, unsigned bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"(map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}
}  // namespace minnow_tma
#endif
