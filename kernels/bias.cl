<%doc>
Per-channel bias of a contiguous tensor viewed as (OUTER, CH, INNER): a convolution's (N, K, P*Q) output
or a linear layer's (rows, out, 1).

bias_add, in place:  y[(o*CH + c)*INNER + i] += bias[c]
  Launch 2-D: global (INNER rounded up, OUTER*CH), dimension 0 runs along INNER, so a work-group reads
  one bias value and streams one contiguous row (PoCL vectorizes it; the generic broadcasting add spent
  64-bit divisions on every element).
bias_add_last_axis: the same for INNER == 1 (a linear layer): global (CH rounded up, OUTER), dimension 0
  runs along the channels.
bias_grad:  grad[c] = sum over o, i of gy[(o*CH + c)*INNER + i]
  Launch 1-D: one work-group of L work-items per channel, global (CH*L), local (L). Work-item l sums a
  fixed subset of the channel's OUTER*INNER elements, then work-item 0 adds the L partial sums in order,
  so the result is deterministic. One launch replaces the two chunked reductions it used to take. One
  barrier, not a tree of log2(L): PoCL compiles a work-item loop per barrier region at the first launch,
  and the tree's seven regions took the PoCL wheel 0.52 s there.

Template parameters (all have defaults):
  T         element type                                         (default "float")
  L         bias_grad: work-items per channel, a power of two    (default 64)
</%doc>
<%page args="T='float', L=64"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void bias_add(__global ${T}* y, const long y_off, __global const ${T}* bias, const long bias_off,
                       const int OUTER, const int CH, const int INNER)
{
    const int i = get_global_id(0), row = get_global_id(1);
    if (${beyond('i', 'INNER')}) return;
    y[y_off + (long) row * INNER + i] += bias[bias_off + row % CH];
}

__kernel void bias_add_last_axis(__global ${T}* y, const long y_off, __global const ${T}* bias,
                                 const long bias_off, const int OUTER, const int CH, const int INNER)
{
    const int c = get_global_id(0), o = get_global_id(1);
    if (${beyond('c', 'CH')}) return;
    y[y_off + (long) o * CH + c] += bias[bias_off + c];
}

__kernel __attribute__((reqd_work_group_size(${L}, 1, 1)))
void bias_grad(__global ${T}* grad, const long grad_off, __global const ${T}* gy, const long gy_off,
               const int OUTER, const int CH, const int INNER)
{
    __local ${T} partial[${L}];
    const int c = get_group_id(0), l = get_local_id(0);
    ${T} acc = (${T}) 0;
    if (INNER >= ${L}) {
        for (int o = 0; o < OUTER; ++o) {
            __global const ${T}* row = gy + gy_off + ((long) o * CH + c) * INNER;
            for (int i = l; i < INNER; i += ${L}) acc += row[i];
        }
    } else {
        const int total = OUTER * INNER;
        for (int t = l; t < total; t += ${L}) {
            const int o = t / INNER, i = t - o * INNER;
            acc += gy[gy_off + ((long) o * CH + c) * INNER + i];
        }
    }
    partial[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (l == 0) {
        ${T} total = (${T}) 0;
        for (int k = 0; k < ${L}; ++k) total += partial[k];
        grad[grad_off + c] = total;
    }
}
