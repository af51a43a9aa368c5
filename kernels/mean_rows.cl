<%doc>
Mean of the rows of a strided 2-D array: out[i] = (in[0][i] + in[1][i] + ... + in[ROWS-1][i]) * scale,
with in[r][i] = in[in_off + r * row_stride + i], summed in row order (as NumPy's sum over axis 0), for
i < n. DistributedDataParallel's buckets: row r is rank r's gradients, scale is 1 / ROWS.

Template parameters (all have defaults):
  T     C element type          (default "float")
  ROWS  number of rows averaged (default 2)

Launch: 1-D, one work-item per output element; the tail is guarded.
</%doc>
<%page args="T='float', ROWS=2"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void mean_of_rows(
    __global ${T}* out, const long out_off,
    __global const ${T}* in, const long in_off, const long row_stride,
    const long n, const ${T} scale)
{
    const long i = get_global_id(0);
    if (${beyond('i', 'n')}) return;
    const __global ${T}* column = in + in_off + i;
    ${T} total = column[0];
% for r in range(1, ROWS):
    total += column[${r} * row_stride];
% endfor
    out[out_off + i] = total * scale;
}
