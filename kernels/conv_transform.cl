<%doc>
Layout transforms of the convolution strategies.

swap_outer_axes: swap the two outer axes of a contiguous (A, B, L) tensor: dst (B, A, L) with dst[b, a, l] = src[a, b, l].
The im2col strategy's output transform of the memo, (K, N·P·Q) seen as (K, N, PQ) -> (N, K, PQ), and its
reverse for the upstream gradient: a block transpose whose blocks are the contiguous PQ-long rows.

Template parameters (all have defaults):
  T   element type, "float" or "double"   (default "float")

Launch: 3-D, global (L, B, A) (rounded up; the tail is guarded), any local size; dimension 0 runs along
the contiguous rows, so neighbouring work-items copy neighbouring elements and no index is divided.

subsample: dst (M, P, Q) <- every SH-th row and SW-th column of src (M, H, W), both contiguous:
dst[m, p, q] = src[m, p·SH, q·SW]. The gemm strategy's input of a strided 1×1 convolution (M = N·C).
Launch: 2-D, global (P, M) (rounded up; the tail is guarded), any local size: one row per work-item.

upsample_zero: dst (M, H, W) <- src (M, P, Q) placed at every SH-th row and SW-th column, zero elsewhere
(and zero past row P·SH or column Q·SW): the input gradient of a strided 1×1 convolution, written once.
Launch: 2-D, global (H, M) (rounded up; the tail is guarded), any local size: one row per work-item.
</%doc>
<%page args="T='float'"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void swap_outer_axes(__global const ${T}* restrict src, const long src_off,
                              __global ${T}* restrict dst, const long dst_off,
                              const long A, const long B, const long L)
{
    const long l = get_global_id(0), b = get_global_id(1), a = get_global_id(2);
    if (l >= L || b >= B || a >= A) return;
    dst[dst_off + (b * A + a) * L + l] = src[src_off + (a * B + b) * L + l];
}

__kernel void subsample(__global const ${T}* restrict src, const long src_off,
                        __global ${T}* restrict dst, const long dst_off,
                        const long M, const int H, const int W, const int P, const int Q,
                        const int SH, const int SW)
{
    const int p = get_global_id(0);
    const long m = get_global_id(1);
    if (p >= P || m >= M) return;
    __global const ${T}* in = src + src_off + (m * H + p * SH) * W;
    __global ${T}* out = dst + dst_off + (m * P + p) * Q;
    for (int q = 0; q < Q; ++q)
        out[q] = in[q * SW];
}

__kernel void upsample_zero(__global const ${T}* restrict src, const long src_off,
                            __global ${T}* restrict dst, const long dst_off,
                            const long M, const int H, const int W, const int P, const int Q,
                            const int SH, const int SW)
{
    const int h = get_global_id(0);
    const long m = get_global_id(1);
    if (h >= H || m >= M) return;
    __global ${T}* out = dst + dst_off + (m * H + h) * W;
    for (int w = 0; w < W; ++w)
        out[w] = (${T})0;
    const int p = h / SH;
    if (h != p * SH || p >= P) return;
    __global const ${T}* in = src + src_off + (m * P + p) * Q;
    for (int q = 0; q < Q; ++q)
        out[q * SW] = in[q];
}
