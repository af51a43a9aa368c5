<%doc>
Fused cross-entropy (over logits) and negative log-likelihood (over log-probabilities) with PyTorch's
options. x: N rows of C values, contiguous; t: N integer targets; w: C class weights (WEIGHTED).

Per row n with target t_n (w_c = 1 without WEIGHTED; lse_n = m_n + log sum_c exp(x[n,c] - m_n), m_n the
row maximum, so large logits never overflow):
  MODE "ce":   row_n = (1 - eps) w_{t_n} (lse_n - x[n, t_n]) + eps / C * sum_c w_c (lse_n - x[n, c])
               (eps = label smoothing; the second term only with SMOOTH)
  MODE "nll":  row_n = -w_{t_n} x[n, t_n]
A row whose target equals ignore_index contributes 0 and weight 0; a target outside [0, C) otherwise makes
the row NaN and is reported in ``flag`` (netcl.runtime.error_flags: the host raises it without a round trip
per call): when flag[0] is 0, ce_forward writes flag[0..5] = 1, the first such row, its target, C,
ignore_index, MODE (0 "ce", 1 "nll").
  REDUCTION "mean": loss = sum_n row_n / sum_n w_{t_n} over the rows not ignored (PyTorch's weighted mean,
                    also for the smoothing term); "sum": sum_n row_n; "none": rows[n] = row_n.

Template parameters (all have defaults):
  T          C element type of x, w, the loss and the gradient          (default "float")
  TI         C type of the targets ("int" or "long")                    (default "long")
  LOCAL      work-group size of ce_forward, a power of two              (default 64)
  MODE       "ce" | "nll"                                               (default "ce")
  WEIGHTED   class weights w are given                                  (default False)
  SMOOTH     label smoothing is on (MODE "ce")                          (default False)
  REDUCTION  "mean" | "sum" | "none"                                    (default "mean")
With every option at its default this is the plain LeNet loss: one forward and one backward launch.

Kernels:
  ce_forward   ONE work-group of LOCAL work-items: item l handles rows l, l+LOCAL, ...; writes lse_n (MODE
               "ce") for backward, the rows (REDUCTION "none"), and reduces the row losses and their
               weights in local memory in a fixed order (deterministic). aux[0] receives the factor the
               gradient carries (1 / sum of weights for the mean, else 1), aux[1] = sum_c w_c.
  ce_backward  one work-item per element:
                 "ce":  gx = s_n ((1 - eps) w_t (p - [c == t]) + eps / C (aux[1] p - w_c)),  p = exp(x - lse_n)
                 "nll": gx = -s_n w_t [c == t]
               with s_n = g[n] (REDUCTION "none") or g * aux[0]; 0 on ignored rows.
</%doc>
<%page args="T='float', TI='long', LOCAL=64, MODE='ce', WEIGHTED=False, SMOOTH=False, REDUCTION='mean'"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

<%def name="class_weight(c)">
% if WEIGHTED:
w[w_off + ${c}]
% else:
(${T}) 1
% endif
</%def>

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void ce_forward(
    __global const ${T}* x, const long x_off,
    __global const ${TI}* t, const long t_off,
    __global const ${T}* w, const long w_off,
    __global ${T}* lse, const long lse_off,
    __global ${T}* rows, const long rows_off,
    __global ${T}* aux, const long aux_off,
    __global ${T}* loss, const long loss_off,
    __global long* flag,
    const int N, const int C, const long ignore_index, const ${T} eps)
{
    __local ${T} partial[${LOCAL}];
    __local ${T} partial_w[${LOCAL}];
    __local int first_bad[${LOCAL}];
    const int l = get_local_id(0);
    ${T} acc = 0, acc_w = 0;
    int bad = N;  /* this item's first row with a target out of range (N: none) */
    for (int n = l; n < N; n += ${LOCAL}) {
        __global const ${T}* row = x + x_off + (long) n * C;
        const long target = (long) t[t_off + n];
        const int ignored = target == ignore_index;
        const int valid = target >= 0 && target < C;
        const long safe = valid ? target : 0;  /* never reads outside the row */
        if (!valid && !ignored && bad == N) bad = n;
        const ${T} w_t = ${class_weight("safe")};
% if MODE == 'ce':
        ${T} m = row[0];
        for (int c = 1; c < C; ++c) m = fmax(m, row[c]);
        ${T} s = 0;
        for (int c = 0; c < C; ++c) s += exp(row[c] - m);
        const ${T} l_n = m + log(s);
        lse[lse_off + n] = l_n;
        ${T} value = w_t * (l_n - row[safe]);
  % if SMOOTH:
        ${T} smooth = 0;
        for (int c = 0; c < C; ++c) smooth += ${class_weight("c")} * (l_n - row[c]);
        value = ((${T}) 1 - eps) * value + eps / (${T}) C * smooth;
  % endif
% else:
        ${T} value = -w_t * row[safe];
% endif
        value = ignored ? (${T}) 0 : (valid ? value : (${T}) NAN);
% if REDUCTION == 'none':
        rows[rows_off + n] = value;
% endif
        acc += value;
        acc_w += ignored ? (${T}) 0 : w_t;
    }
    partial[l] = acc;
    partial_w[l] = acc_w;
    first_bad[l] = bad;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (l == 0) {
        /* in order by one work-item: one barrier region instead of a barrier in a loop, which PoCL
           compiles slowly at the first launch */
        ${T} sum = 0, sum_w = 0;
        int first = N;
        for (int k = 0; k < ${LOCAL}; ++k) {
            sum += partial[k];
            sum_w += partial_w[k];
            first = min(first, first_bad[k]);
        }
        if (first < N && flag[0] == 0) {
            flag[0] = 1;
            flag[1] = first;
            flag[2] = (long) t[t_off + first];
            flag[3] = C;
            flag[4] = ignore_index;
            flag[5] = ${0 if MODE == 'ce' else 1};
        }
% if REDUCTION == 'mean':
        loss[loss_off] = sum / sum_w;
        aux[aux_off] = (${T}) 1 / sum_w;
% elif REDUCTION == 'sum':
        loss[loss_off] = sum;
        aux[aux_off] = (${T}) 1;
% else:
        aux[aux_off] = (${T}) 1;  /* "none": the rows are the output */
% endif
        ${T} total = 0;
        for (int c = 0; c < C; ++c) total += ${class_weight("c")};
        aux[aux_off + 1] = total;
    }
}

__kernel void ce_backward(
    __global const ${T}* x, const long x_off,
    __global const ${TI}* t, const long t_off,
    __global const ${T}* w, const long w_off,
    __global const ${T}* lse, const long lse_off,
    __global const ${T}* aux, const long aux_off,
    __global const ${T}* g, const long g_off,
    __global ${T}* gx, const long gx_off,
    const int N, const int C, const long ignore_index, const ${T} eps)
{
    const long e = get_global_id(0);
    if (${beyond('e', '(long) N * C')}) return;
    const int n = (int) (e / C), c = (int) (e % C);
    const long target = (long) t[t_off + n];
    const int ignored = target == ignore_index;
    const int valid = target >= 0 && target < C;
    const ${T} w_t = ${class_weight("(valid ? target : 0)")};
    const ${T} hot = (target == (long) c) ? (${T}) 1 : (${T}) 0;
% if REDUCTION == 'none':
    const ${T} scale = g[g_off + n];
% else:
    const ${T} scale = g[g_off] * aux[aux_off];
% endif
% if MODE == 'ce':
    const ${T} p = exp(x[x_off + e] - lse[lse_off + n]);
    ${T} d = w_t * (p - hot);
  % if SMOOTH:
    d = ((${T}) 1 - eps) * d + eps / (${T}) C * (aux[aux_off + 1] * p - ${class_weight("c")});
  % endif
% else:
    const ${T} d = -w_t * hot;
% endif
    gx[gx_off + e] = ignored ? (${T}) 0 : (valid ? scale * d : (${T}) NAN);
}
