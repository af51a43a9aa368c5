<%doc>
Elementwise map: out[i] = EXPR(a0[..], a1[..], ..., s0, s1, ...) over a contiguous output.

Template parameters (all have defaults):
  OUT_TYPE   C type of the output                                   (default "float")
  IN_TYPES   C types of the tensor inputs a0, a1, ...; may be empty  (default ("float",))
  N_SCALARS  number of scalar arguments s0, s1, ... (of OUT_TYPE... or COMPUTE_TYPE) (default 0)
  COMPUTE_TYPE type the inputs are converted to before EXPR          (default OUT_TYPE)
  EXPR       C expression of a0.., s0..; its value is stored         (default "a0")
  NDIM       0: every operand is contiguous with the output's shape (flat indexing);
             k>0: inputs are strided views over a k-dim output shape; shape and strides come
             in `meta` as [shape[0..k), strides of a0 [0..k), strides of a1 ...]   (default 0)

bool tensors are "uchar" buffers holding exactly 0 or 1 (the caller wraps EXPR in `!= 0` for a bool output).
Launch: 1-D, one work-item per output element; global size may exceed n (the tail is guarded).
Each tensor input comes with an element offset so views into a larger buffer need no copy.
</%doc>
<%page args="OUT_TYPE='float', IN_TYPES=('float',), N_SCALARS=0, COMPUTE_TYPE=None, EXPR='a0', NDIM=0"/>
<%! from netcl.runtime.cl_guards import beyond %>
<%
    CT = COMPUTE_TYPE or OUT_TYPE
    uses_double = 'double' in (OUT_TYPE, CT) + tuple(IN_TYPES)
%>
% if uses_double:
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void elementwise(
    __global ${OUT_TYPE}* out, const long out_off,
% for k, t in enumerate(IN_TYPES):
    __global const ${t}* in${k}, const long in${k}_off,
% endfor
% for k in range(N_SCALARS):
    const ${CT} s${k},
% endfor
    __constant const long* meta,
    const long n)
{
    const long i = get_global_id(0);
    if (${beyond('i', 'n')}) return;
% if NDIM == 0:
  % for k in range(len(IN_TYPES)):
    const ${CT} a${k} = (${CT}) in${k}[in${k}_off + i];
  % endfor
% else:
  % for k in range(len(IN_TYPES)):
    long p${k} = in${k}_off;
  % endfor
    long rest = i;
  % for d in reversed(range(NDIM)):
    {
        const long coord = rest % meta[${d}];
        rest /= meta[${d}];
    % for k in range(len(IN_TYPES)):
        p${k} += coord * meta[${NDIM * (k + 1) + d}];
    % endfor
    }
  % endfor
  % for k in range(len(IN_TYPES)):
    const ${CT} a${k} = (${CT}) in${k}[p${k}];
  % endfor
% endif
    out[out_off + i] = (${OUT_TYPE}) (${EXPR});
}

