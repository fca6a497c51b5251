// Host-parse stand-in for CUDA's cuda_bf16.h (see minnow_cuda_shim.h).
#pragma once
#include "cuda_fp16.h"
struct __nv_bfloat16 {
    unsigned short bits;
};
struct __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
float __bfloat162float(__nv_bfloat16 x);
__nv_bfloat16 __float2bfloat16(float x);
__nv_bfloat16 __float2bfloat16_rn(float x);
__nv_bfloat16 __ushort_as_bfloat16(unsigned short x);
unsigned short __bfloat16_as_ushort(__nv_bfloat16 x);
__nv_bfloat162 __floats2bfloat162_rn(float a, float b);
__nv_bfloat162 __halves2bfloat162(__nv_bfloat16 a, __nv_bfloat16 b);
__nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b);
__nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b);
float __low2float(__nv_bfloat162 x);
float __high2float(__nv_bfloat162 x);
