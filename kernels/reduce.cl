<%doc>
Reduction of a contiguous tensor viewed as (outer, R, inner) along R, in chunks:
  out[o, c, i] = OP over r in [c*CHUNK, min(R, (c+1)*CHUNK)) of in[o, r, i]
The caller runs it again over the chunk axis when R needs more than one chunk, so no work-item ever
loops over more than CHUNK elements (pairwise-like accuracy, and parallelism when outer*inner is small).

Template parameters (all have defaults):
  IN_TYPE   C type of the input                     (default "float")
  ACC_TYPE  accumulator type                        (default IN_TYPE)
  OUT_TYPE  C type of the values written            (default IN_TYPE)
  OP        "sum" | "max" | "min" | "argmax" | "argmin"   (default "sum")
  WITH_INDEX  input comes with an index array (second pass of argmax)   (default False)

argmax/argmin write values to `out` and their indices (long) to `out_index`; ties pick the lowest
index, as NumPy does. NaN propagates through max/min and is what argmax/argmin point at (as in NumPy
and PyTorch).
Launch: 3-D global size (inner, chunks, outer); any local size.
</%doc>
<%page args="IN_TYPE='float', ACC_TYPE=None, OUT_TYPE=None, OP='sum', WITH_INDEX=False"/>
<%
    ACC = ACC_TYPE or IN_TYPE
    OUT = OUT_TYPE or IN_TYPE
    BETTER = '<' if OP in ('min', 'argmin') else '>'
%>
% if 'double' in (IN_TYPE, ACC, OUT):
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void reduce_axis(
    __global ${OUT}* out, const long out_off, __global long* out_index, const long out_index_off,
    __global const ${IN_TYPE}* in, const long in_off,
    __global const long* in_index, const long in_index_off,
    const long outer, const long R, const long inner, const long chunk)
{
    const long i = get_global_id(0), c = get_global_id(1), o = get_global_id(2);
    const long chunks = (R + chunk - 1) / chunk;
    if (i >= inner || c >= chunks || o >= outer) return;
    const long r0 = c * chunk;
    const long r1 = min(R, r0 + chunk);
    __global const ${IN_TYPE}* p = in + in_off + o * R * inner + i;
% if OP == 'sum':
    ${ACC} acc = (${ACC})0;
    for (long r = r0; r < r1; ++r) acc += (${ACC}) p[r * inner];
    out[out_off + (o * chunks + c) * inner + i] = (${OUT}) acc;
% else:
    ${ACC} best = (${ACC}) p[r0 * inner];
  % if WITH_INDEX:
    __global const long* q = in_index + in_index_off + o * R * inner + i;
    long best_at = q[r0 * inner];
  % else:
    long best_at = r0;
  % endif
    for (long r = r0 + 1; r < r1; ++r) {
        const ${ACC} v = (${ACC}) p[r * inner];
        if (v ${BETTER} best || (v != v && best == best)) {
            best = v;
  % if WITH_INDEX:
            best_at = q[r * inner];
  % else:
            best_at = r;
  % endif
        }
    }
    out[out_off + (o * chunks + c) * inner + i] = (${OUT}) best;
  % if OP in ('argmax', 'argmin'):
    out_index[out_index_off + (o * chunks + c) * inner + i] = best_at;
  % endif
% endif
}
