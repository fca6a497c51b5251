// Declarations that let a host C++ compiler (g++ or clang++) parse minnow's CUDA C++ with
// `-fsyntax-only`, on machines with no CUDA toolkit. `cargo xtask kernel-syntax` force-includes
// this file. Only names the kernels use are declared, and nothing here is ever executed: it exists
// to catch front-end errors (typos, wrong types, bad template arguments) before a GPU machine is
// needed. Inline PTX is not checked (ptxas does that): the task replaces each `asm` statement
// with a call that only evaluates its operands.
#pragma once
#include <math.h>
#include <cstdint>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __constant__
#define __launch_bounds__(...)
#define __cluster_dims__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __noinline__

struct minnow_shim_dim3 {
    unsigned x, y, z;
};
extern const minnow_shim_dim3 threadIdx, blockIdx, blockDim, gridDim;
extern const int warpSize;

#define MINNOW_SHIM_VEC2(T, N) \
    struct N##2 { T x, y; };     \
    inline N##2 make_##N##2(T x, T y) { return {x, y}; }
#define MINNOW_SHIM_VEC4(T, N)     \
    struct alignas(16) N##4 { T x, y, z, w; }; \
    inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
MINNOW_SHIM_VEC2(int, int)
MINNOW_SHIM_VEC2(unsigned, uint)
MINNOW_SHIM_VEC2(float, float)
MINNOW_SHIM_VEC4(int, int)
MINNOW_SHIM_VEC4(unsigned, uint)
MINNOW_SHIM_VEC4(float, float)

void __syncthreads();
void __syncwarp(unsigned mask = 0xffffffffu);
void __threadfence();
template <class T> T __ldcg(const T* p);  // a load that skips L1 (ld.global.cg)
void __trap();
void __nanosleep(unsigned ns);
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32);
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32);
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = 32);
template <class T> unsigned __match_any_sync(unsigned mask, T v);
unsigned __reduce_add_sync(unsigned mask, unsigned v);
unsigned __ballot_sync(unsigned mask, int predicate);
int __any_sync(unsigned mask, int predicate);
int __popc(unsigned x);
int __ffs(int x);
unsigned __byte_perm(unsigned x, unsigned y, unsigned s);
size_t __cvta_generic_to_shared(const void* p);
float __uint_as_float(unsigned x);
float __int_as_float(int x);
unsigned __float_as_uint(float x);
int __float_as_int(float x);
float __fmaf_rn(float a, float b, float c);
float __fdiv_rn(float a, float b);
float __fmul_rn(float a, float b);
float __fadd_rn(float a, float b);
float __fsub_rn(float a, float b);
float __expf(float x);
int atomicAdd(int* p, int v);
unsigned atomicAdd(unsigned* p, unsigned v);
float atomicAdd(float* p, float v);
unsigned long long atomicAdd(unsigned long long* p, unsigned long long v);
int atomicMax(int* p, int v);
int atomicCAS(int* p, int cmp, int v);
unsigned atomicCAS(unsigned* p, unsigned cmp, unsigned v);
int atomicExch(int* p, int v);

// CUDA's device min/max accept mixed integer arguments; the common type is what they return.
template <class A, class B> auto min(A a, B b) -> decltype(a < b ? a : b) { return a < b ? a : b; }
template <class A, class B> auto max(A a, B b) -> decltype(a < b ? a : b) { return a < b ? b : a; }
float rsqrtf(float x);

// The operands of an inline-PTX statement, evaluated for type checking only.
template <class... T> void minnow_shim_asm_operands(T&&...);
