// Micro-benchmark behind docs/performance.md attempt 20: how fast one CTA per multiprocessor can
// stream 128-row weight tiles of a [100,352 x 2048] BF16 matrix (411 MB) into shared memory
//   mode 0: one `cp.async.bulk` per row segment of `chunk` bytes (rows padded by 16 bytes),
//   mode 1: one `cp.async.bulk.tensor` (TMA) box of chunk/2 columns x 128 rows per stage,
// against a plain 16-byte-load read of the same bytes. Consumers only wait and release stages.
// Needs nvcc and a Hopper GPU (not part of the build):
//   nvcc -O3 -arch=sm_90a -o tma_stream xtask/micro/tma_stream.cu -lcuda && ./tma_stream
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>

__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count)); }
__device__ __forceinline__ void expect_tx(unsigned bar, unsigned bytes) { asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory"); }
__device__ __forceinline__ void arrive(unsigned bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory"); }
__device__ __forceinline__ void wait(unsigned bar, unsigned par) {
  unsigned done = 0;
  while (!done) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(bar), "r"(par) : "memory");
}
__device__ __forceinline__ void bulk(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
__device__ __forceinline__ void tma2d(unsigned dst, const CUtensorMap* map, int x, int y, unsigned bar) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               ::"r"(dst), "l"(map), "r"(x), "r"(y), "r"(bar) : "memory");
}

// W: rows x K bf16 (row = K*2 bytes). Tiles of 128 rows; stage = 128 rows x chunk bytes.
// mode 0: bulk row segments (pitch chunk + 16), mode 1: one TMA box (chunk / 2 x 128) per stage
__global__ void __launch_bounds__(288, 1) stream(const char* W, long rows, int K, int chunk, int stages, int mode,
                                                 const __grid_constant__ CUtensorMap map, unsigned long long* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  const int pitch = mode == 0 ? chunk + 16 : chunk;
  const int stage_bytes = 128 * pitch;
  unsigned long long* bars = (unsigned long long*)(smem + stages * stage_bytes);
  const unsigned full0 = sa(bars), empty0 = sa(bars + stages);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (threadIdx.x == 0) for (int s = 0; s < stages; ++s) { mbar_init(full0 + 8 * s, 1); mbar_init(empty0 + 8 * s, 8); }
  __syncthreads();
  const long tiles = rows / 128; const int ksteps = K * 2 / chunk;
  if (warp == 8) {
    int it = 0;
    for (long tile = blockIdx.x; tile < tiles; tile += gridDim.x)
      for (int ks = 0; ks < ksteps; ++ks, ++it) {
        const int s = it % stages;
        wait(empty0 + 8 * s, ((it / stages) & 1) ^ 1);
        if (lane == 0) expect_tx(full0 + 8 * s, 128 * chunk);
        __syncwarp();
        const unsigned dst = sa(smem + s * stage_bytes);
        if (mode == 1) {
          if (lane == 0) tma2d(dst, &map, ks * chunk / 2, (int)(tile * 128), full0 + 8 * s);
        } else {
          for (int r = lane; r < 128; r += 32) bulk(dst + r * pitch, W + (tile * 128 + r) * (long)K * 2 + (long)ks * chunk, chunk, full0 + 8 * s);
        }
      }
    return;
  }
  int it = 0; unsigned acc = 0;
  for (long tile = blockIdx.x; tile < tiles; tile += gridDim.x)
    for (int ks = 0; ks < ksteps; ++ks, ++it) {
      const int s = it % stages;
      wait(full0 + 8 * s, (it / stages) & 1);
      acc += smem[s * stage_bytes + threadIdx.x * 4];
      __syncwarp();
      if (lane == 0) arrive(empty0 + 8 * s);
    }
  if (acc == 0x12345) sink[0] = acc;
}

__global__ void plain_read(const uint4* W, long n, unsigned long long* sink) {
  uint4 a = make_uint4(0,0,0,0);
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x) { uint4 v = W[i]; a.x ^= v.x; a.y ^= v.y; }
  if (a.x == 0x12345 && a.y == 7) sink[0] = a.x;
}

int main() {
  const int K = 2048; const long rows = 49L * 1024 * 2;  // ~ 205 MB bf16 (gate/up of 49 entries, x2 for cache flush)
  const size_t bytes = rows * K * 2;
  char* W; cudaMalloc(&W, bytes); cudaMemset(W, 1, bytes);
  unsigned long long* sink; cudaMalloc(&sink, 8);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  CUtensorMap maps[4];
  int chunks[4] = {128, 256, 512, 4096};
  for (int c = 0; c < 4; ++c) {
    cuuint64_t dims[2] = {(cuuint64_t)K, (cuuint64_t)rows};
    cuuint64_t strides[1] = {(cuuint64_t)K * 2};
    cuuint32_t box[2] = {(cuuint32_t)(chunks[c] / 2 > 256 ? 256 : chunks[c] / 2), 128};
    cuuint32_t es[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(&maps[c], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, W, dims, strides, box, es,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) printf("encode chunk %d failed %d\n", chunks[c], r);
  }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  auto timeit = [&](auto launch, const char* name, double moved) {
    launch(); cudaDeviceSynchronize();
    float best = 1e9;
    for (int i = 0; i < 5; ++i) { cudaEventRecord(e0); launch(); cudaEventRecord(e1); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); if (ms < best) best = ms; }
    cudaError_t err = cudaGetLastError();
    printf("%-40s %8.1f us  %6.2f TB/s %s\n", name, best * 1e3, moved / (best * 1e-3) / 1e12, err ? cudaGetErrorString(err) : "");
  };
  timeit([&] { plain_read<<<sms * 8, 512>>>((const uint4*)W, bytes / 16, sink); }, "plain uint4 read", bytes);
  struct V { int mode, chunk, stages, ctas; };
  V vs[] = {{0,256,4,1},{0,256,6,1},{0,512,3,1},{0,256,2,2},{0,128,6,1},{1,256,4,1},{1,256,6,1},{1,512,3,1},{1,128,8,1},{1,256,3,2}};
  for (auto v : vs) {
    int pitch = v.mode == 0 ? v.chunk + 16 : v.chunk;
    size_t sm = (size_t)v.stages * 128 * pitch + 16 * v.stages;
    cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
    int ci = v.chunk == 128 ? 0 : v.chunk == 256 ? 1 : 2;
    char name[96]; snprintf(name, 96, "%s chunk %d stages %d ctas/SM %d", v.mode ? "tma box" : "bulk rows", v.chunk, v.stages, v.ctas);
    timeit([&] { stream<<<sms * v.ctas, 288, sm>>>(W, rows, K, v.chunk, v.stages, v.mode, maps[ci], sink); }, name, bytes);
  }
  return 0;
}
