<%doc>
Swap the two outer axes of a contiguous (A, B, L) tensor: dst (B, A, L) with dst[b, a, l] = src[a, b, l].
The im2col strategy's output transform of the memo, (K, N·P·Q) seen as (K, N, PQ) -> (N, K, PQ), and its
reverse for the upstream gradient: a block transpose whose blocks are the contiguous PQ-long rows.

Template parameters (all have defaults):
  T   element type, "float" or "double"   (default "float")

Launch: 3-D, global (L, B, A) (rounded up; the tail is guarded), any local size; dimension 0 runs along
the contiguous rows, so neighbouring work-items copy neighbouring elements and no index is divided.
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
