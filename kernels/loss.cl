<%doc>
Fused cross-entropy over logits x (N rows of C classes, contiguous) and integer targets t (N):
  loss = SCALE * sum_n (lse_n - x[n, t_n]),   lse_n = m_n + log(sum_c exp(x[n, c] - m_n)),  m_n = max_c x[n, c]
(log-softmax computed around the row maximum, so large logits never overflow). SCALE is 1/N for the
mean, 1 for the sum. A target outside [0, C) makes that row's loss NaN (checked on the device, so no
host round trip).

Template parameters (all have defaults):
  T      C element type of x, the loss and the gradient   (default "float")
  TI     C type of the targets ("int" or "long")          (default "long")
  LOCAL  work-group size of ce_forward, a power of two    (default 64)

Kernels:
  ce_forward   ONE work-group of LOCAL work-items: item l handles rows l, l+LOCAL, ...; writes lse_n for
               backward and reduces the row losses in local memory in a fixed order (deterministic).
  ce_backward  one work-item per logit: gx[n, c] = g * SCALE * (exp(x[n, c] - lse_n) - [c == t_n]),
               with g the upstream gradient read from device memory.
</%doc>
<%page args="T='float', TI='long', LOCAL=64"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void ce_forward(
    __global const ${T}* x, const long x_off,
    __global const ${TI}* t, const long t_off,
    __global ${T}* lse, const long lse_off, __global ${T}* loss, const long loss_off,
    const int N, const int C, const ${T} scale)
{
    __local ${T} partial[${LOCAL}];
    const int l = get_local_id(0);
    ${T} acc = 0;
    for (int n = l; n < N; n += ${LOCAL}) {
        __global const ${T}* row = x + x_off + (long) n * C;
        ${T} m = row[0];
        for (int c = 1; c < C; ++c) m = fmax(m, row[c]);
        ${T} s = 0;
        for (int c = 0; c < C; ++c) s += exp(row[c] - m);
        const ${T} l_n = m + log(s);
        lse[lse_off + n] = l_n;
        const long target = (long) t[t_off + n];
        const int valid = target >= 0 && target < C;
        acc += valid ? l_n - row[valid ? target : 0] : NAN;  /* never reads outside the row */
    }
    partial[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = ${LOCAL // 2}; span > 0; span >>= 1) {
        if (l < span) partial[l] += partial[l + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) loss[loss_off] = partial[0] * scale;
}

__kernel void ce_backward(
    __global const ${T}* x, const long x_off,
    __global const ${TI}* t, const long t_off,
    __global const ${T}* lse, const long lse_off,
    __global const ${T}* g, const long g_off,
    __global ${T}* gx, const long gx_off,
    const int N, const int C, const ${T} scale)
{
    const long e = get_global_id(0);
    if (e >= (long) N * C) return;
    const int n = (int) (e / C), c = (int) (e % C);
    const ${T} p = exp(x[x_off + e] - lse[lse_off + n]);
    const ${T} hot = ((long) t[t_off + n] == (long) c) ? (${T}) 1 : (${T}) 0;
    gx[gx_off + e] = g[g_off] * scale * (p - hot);
}
