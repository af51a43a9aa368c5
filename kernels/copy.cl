<%doc>
Strided copy: dst view <- src view over a common NDIM-dimensional shape; `meta` holds
[shape[0..NDIM), dst strides[0..NDIM), src strides[0..NDIM)] in elements. A src stride of 0 broadcasts.

Template parameters (all have defaults):
  T      C element type                 (default "float")
  NDIM   number of (collapsed) dimensions  (default 1)

Launch: 1-D, one work-item per destination element; the tail is guarded.
</%doc>
<%page args="T='float', NDIM=1"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void strided_copy(
    __global ${T}* dst, const long dst_off,
    __global const ${T}* src, const long src_off,
    __constant const long* meta, const long n)
{
    const long i = get_global_id(0);
    if (${beyond('i', 'n')}) return;
    long pd = dst_off, ps = src_off, rest = i;
% for d in reversed(range(NDIM)):
    {
        const long coord = rest % meta[${d}];
        rest /= meta[${d}];
        pd += coord * meta[${NDIM + d}];
        ps += coord * meta[${2 * NDIM + d}];
    }
% endfor
    dst[pd] = src[ps];
}
