// Host-parse stand-in for CUDA's mma.h: the WMMA fragments and functions minnow uses (see
// minnow_cuda_shim.h).
#pragma once
#include "cuda_bf16.h"
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
    static constexpr int num_elements = 8;
    T x[num_elements];
};
template <class Use, int M, int N, int K, class T, class Layout, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const P* p, unsigned ldm);
template <class Use, int M, int N, int K, class T, class P>
void load_matrix_sync(fragment<Use, M, N, K, T, void>& f, const P* p, unsigned ldm, layout_t layout);
template <int M, int N, int K, class T, class P>
void store_matrix_sync(P* p, const fragment<accumulator, M, N, K, T, void>& f, unsigned ldm, layout_t layout);
template <class Use, int M, int N, int K, class T, class Layout, class V>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, V v);
template <int M, int N, int K, class TA, class LA, class TB, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC, void>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC, void>& c);
}  // namespace wmma
}  // namespace nvcuda
