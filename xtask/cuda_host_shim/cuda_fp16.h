// Host-parse stand-in for CUDA's cuda_fp16.h (see minnow_cuda_shim.h).
#pragma once
struct __half {
    unsigned short bits;
};
struct __half2 {
    __half x, y;
};
float __half2float(__half x);
__half __float2half(float x);
__half __float2half_rn(float x);
__half __ushort_as_half(unsigned short x);
__half2 __hmul2(__half2 a, __half2 b);
__half2 __hsub2(__half2 a, __half2 b);
float __low2float(__half2 x);
float __high2float(__half2 x);
