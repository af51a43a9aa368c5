<%doc>
Batch normalization over channels: x viewed as (N, C, L) contiguous from its offset (L = H*W for
BatchNorm2d, L = 1 or the length for BatchNorm1d). M = N*L values per channel.

Forward (two kernels):
  bn_stats     one work-group per channel: mean and the biased variance (two passes over the channel, so
               the variance never suffers the cancellation of E[x^2] - E[x]^2); with UPDATE_RUNNING it also
               moves the running statistics:
                 factor = CUMULATIVE ? 1 / (num_batches_tracked + 1) : momentum
                 running_mean = (1 - factor) running_mean + factor mean
                 running_var  = (1 - factor) running_var  + factor var * M / (M - 1)   (unbiased)
               It only reads num_batches_tracked; bn_apply's COUNT increments it afterwards (the groups of
               bn_stats run in no fixed order, so none of them can both read and write it).
  bn_apply     one work-item per `chunk` consecutive elements of a row (a runtime argument: the whole row
               on CPUs, where the item's loop vectorizes and the channel constants are computed once; 1
               elsewhere), global (ceil(L / chunk), N*C):
                 z = (x - mean[c]) * rsqrt(var[c] + eps) * weight[c] + bias[c]  (+ r)   ;  y = RELU ? max(z, 0) : z
               (RELU6: y = min(max(z, 0), 6); the activations' text is netcl.runtime.cl_activation's, which
               the convolutions' fused epilogues share)
               mean/var are the batch statistics in training and the running ones in eval.
Inference with a folded convolution (netcl.nn.fusion): bn_fold computes, per output channel k of the
convolution before the BatchNorm, s = weight[k] * rsqrt(running_var[k] + eps),
  folded_w[k, :] = s * conv_w[k, :],  folded_b[k] = bias[k] + s * (conv_b[k] - running_mean[k])
(one item per weight element), and bn_apply with SHIFT_ONLY adds folded_b (plus r, then the ReLU) to the
folded convolution's output in one pass.
Backward (two kernels), with dz = RELU ? (y > 0 ? dy : 0) : dy (the mask comes from the saved output y;
RELU6: 0 < y < 6, PyTorch's hardtanh_backward, which passes nothing at either bound):
  bn_backward_reduce  one work-group per channel: grad_bias[c] = sum dz, grad_weight[c] = sum dz * xhat
  bn_backward_apply   one work-item per `chunk` elements, as bn_apply:
                 BATCH_STATS: dx = weight[c] * invstd * (dz - (sum dz + xhat * sum dz*xhat) / M)
                 else (running statistics are constants): dx = dz * weight[c] * invstd
               and with RESIDUAL it also writes dr = dz (the gradient of the residual input).

Reduction geometry (bn_stats, bn_backward_reduce): `parts` items share each row of L elements (a runtime
argument; LOCAL / parts rows are in flight), and no item divides an index per element. With ITEM_RUNS each
item reads one contiguous run of its row (CPUs: a sequential, cache-friendly loop per item); without, the
items of a row interleave so consecutive items read consecutive addresses (GPUs: coalesced loads).
The elementwise kernels mark their pointers restrict, so the per-channel constants (uniform across a
work-group) can be hoisted out of PoCL's work-item loops.

Template parameters (all have defaults):
  T               C element type of x, y, the statistics and the parameters         (default "float")
  ACC             C type of the accumulators                                          (default "float")
  LOCAL           work-group size of the per-channel reductions, a power of two       (default 64)
  AFFINE          weight and bias are applied (else weight 1, bias 0)                 (default True)
  RELU            fuse a ReLU after the normalization (forward and backward)          (default False)
  RELU6           with RELU, the fused ReLU also clamps at 6 (ReLU6)                  (default False)
  HARDSWISH       bn_apply only: y = z relu6(z + 3) / 6 (inference: no backward
                  kernel has it, as the mask cannot be told from y)                   (default False)
  RESIDUAL        add a residual input r before the ReLU (z = bn(x) + r)              (default False)
  UPDATE_RUNNING  bn_stats moves running_mean / running_var                           (default False)
  CUMULATIVE      momentum=None: the factor is 1 / (num_batches_tracked + 1)          (default False)
  COUNT           bn_apply's item 0 increments num_batches_tracked                    (default False)
  BATCH_STATS     backward through batch statistics (training) or constants (eval)   (default True)
  ITEM_RUNS       reduction items read contiguous runs (see above)                    (default True)
  RUN_LANES       with ITEM_RUNS, a run is summed RUN_LANES elements at a time into that many
                  independent accumulators (element loads that LLVM merges into vector loads; 1: one
                  scalar chain, which is bound by the add's latency, not by memory)   (default 1)
  SHIFT_ONLY      bn_apply adds bias[c] only (the folded convolution's epilogue)      (default False)
  CONV_BIAS       bn_fold: the convolution has a bias                                 (default False)
</%doc>
<%page args="T='float', ACC='float', LOCAL=64, AFFINE=True, RELU=False, RELU6=False, HARDSWISH=False, RESIDUAL=False, UPDATE_RUNNING=False, CUMULATIVE=False, COUNT=False, BATCH_STATS=True, ITEM_RUNS=True, RUN_LANES=1, SHIFT_ONLY=False, CONV_BIAS=False"/>
% if T == 'double' or ACC == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

<%! from netcl.runtime import cl_vectors %>
<%! from netcl.runtime.cl_activation import apply_activation %>
<%
    # bn_apply's activation (netcl.runtime.cl_activation holds its text, shared with the convolutions' epilogues)
    ACTIVATION = "hardswish" if HARDSWISH else ("relu6" if RELU6 else ("relu" if RELU else "none"))
    AV = f"{ACC}{RUN_LANES}"
    def wide_load(pointer):
        # RUN_LANES elements as one accumulator vector, converted lane by lane: no vloadN or convert_
        # built-in (netcl.runtime.cl_vectors says why)
        return cl_vectors.vload(AV, RUN_LANES, pointer, ACC)
    def lane_sum(v):
        return "(" + " + ".join(f"{v}.s{k:x}" for k in range(RUN_LANES)) + ")" if RUN_LANES > 1 else v
%>
<%def name="tree_sum(buf)">
    for (int span = ${LOCAL // 2}; span > 0; span >>= 1) {
        if (l < span) ${buf}[l] += ${buf}[l + span];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
</%def>

/* Visit every element of channel c: `body` sees the element's index `i`. The runtime argument `parts`
   says how many items share one row (LOCAL / parts rows are in flight at a time). */
<%def name="channel_loop(body, vector_body='')">
    {
        const int rows_per_step = ${LOCAL} / parts, row0 = l / parts, part = l % parts;
        if (row0 < rows_per_step) {
% if ITEM_RUNS:
            const int seg = (L + parts - 1) / parts;
            const int j0 = part * seg, j1 = min(L, j0 + seg);
% endif
            for (int n = row0; n < N; n += rows_per_step) {
                const long base = ((long) n * C + c) * L;
% if ITEM_RUNS:
                int j = j0;
  % if RUN_LANES > 1 and vector_body:
                for (; j + ${RUN_LANES} <= j1; j += ${RUN_LANES}) {
                    const long i = base + j;
                    ${vector_body}
                }
  % endif
                for (; j < j1; ++j) {
% else:
                for (int j = part; j < L; j += parts) {
% endif
                    const long i = base + j;
                    ${body}
                }
            }
        }
    }
</%def>

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void bn_stats(
    __global const ${T}* x, const long x_off,
    __global ${T}* mean, const long mean_off, __global ${T}* var, const long var_off,
    __global ${T}* running_mean, const long rm_off, __global ${T}* running_var, const long rv_off,
    __global const long* num_batches_tracked, const long nbt_off,
    const int N, const int C, const int L, const int parts, const ${T} momentum)
{
    __local ${ACC} partial[${LOCAL}];
    const int l = get_local_id(0);
    const int c = get_group_id(0);
    const long M = (long) N * L;
    __global const ${T}* xs = x + x_off;

    ${ACC} acc = 0;
% if RUN_LANES > 1:
    ${AV} lanes = (${AV}) 0;
% endif
    ${channel_loop("acc += (" + ACC + ") xs[i];", "lanes += " + wide_load("xs + i") + ";")}
% if RUN_LANES > 1:
    acc += ${lane_sum("lanes")};
% endif
    partial[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    ${tree_sum("partial")}
    const ${ACC} mu = partial[0] / (${ACC}) M;
    barrier(CLK_LOCAL_MEM_FENCE);

    acc = 0;
% if RUN_LANES > 1:
    lanes = (${AV}) 0;
% endif
    ${channel_loop("const " + ACC + " d = (" + ACC + ") xs[i] - mu; acc += d * d;",
                   "const " + AV + " d = " + wide_load("xs + i") + " - mu; lanes += d * d;")}
% if RUN_LANES > 1:
    acc += ${lane_sum("lanes")};
% endif
    partial[l] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    ${tree_sum("partial")}
    if (l == 0) {
        const ${ACC} biased = partial[0] / (${ACC}) M;
        mean[mean_off + c] = (${T}) mu;
        var[var_off + c] = (${T}) biased;
% if UPDATE_RUNNING:
  % if CUMULATIVE:
        const ${ACC} factor = (${ACC}) 1 / (${ACC}) (num_batches_tracked[nbt_off] + 1);
  % else:
        const ${ACC} factor = (${ACC}) momentum;
  % endif
        const ${ACC} unbiased = partial[0] / (${ACC}) (M - 1);
        running_mean[rm_off + c] = (${T}) ((1 - factor) * (${ACC}) running_mean[rm_off + c] + factor * mu);
        running_var[rv_off + c] = (${T}) ((1 - factor) * (${ACC}) running_var[rv_off + c] + factor * unbiased);
% endif
    }
}

/* The per-channel constants of element `plane` (= n*C + c): invstd and the affine weight and bias. */
<%def name="channel_constants()">
    const int c = plane % C;
    const ${T} mu = mean[mean_off + c];
    const ${T} invstd = rsqrt(var[var_off + c] + eps);
% if AFFINE:
    const ${T} gamma = weight[w_off + c], beta = bias[b_off + c];
% else:
    const ${T} gamma = (${T}) 1, beta = (${T}) 0;
% endif
</%def>

__kernel void bn_apply(
    __global const ${T}* restrict x, const long x_off,
    __global const ${T}* restrict r, const long r_off,
    __global ${T}* restrict y, const long y_off,
    __global const ${T}* restrict mean, const long mean_off, __global const ${T}* restrict var, const long var_off,
    __global const ${T}* restrict weight, const long w_off, __global const ${T}* restrict bias, const long b_off,
    __global long* restrict num_batches_tracked, const long nbt_off,
    const int NC, const int C, const int L, const int chunk, const ${T} eps)
{
    const int j0 = get_global_id(0) * chunk;
    const int plane = get_global_id(1);
% if COUNT:
    if (j0 == 0 && plane == 0) num_batches_tracked[nbt_off] += 1;
% endif
    if (j0 >= L || plane >= NC) return;
% if SHIFT_ONLY:
    const ${T} scale = (${T}) 1, shift = bias[b_off + plane % C];
% else:
    ${channel_constants()}
    const ${T} scale = invstd * gamma, shift = beta - mu * scale;
% endif
    const int j1 = min(L, j0 + chunk);
    for (int j = j0; j < j1; ++j) {
        const long i = (long) plane * L + j;
        ${T} z = x[x_off + i] * scale + shift;
% if RESIDUAL:
        z += r[r_off + i];
% endif
        ${apply_activation(ACTIVATION, "z", T)}
        y[y_off + i] = z;
    }
}

/* dz of element i: the upstream gradient, masked by the fused ReLU's output. Both values are loaded
   before the choice, so it compiles to a select: a load under a data-dependent condition became a
   branch per element under PoCL and made the reduction 2.5x slower. */
<%def name="masked_grad(i)">
<% out = f"y[y_off + {i}]" %>
% if RELU6:
select((${T}) 0, dy[dy_off + ${i}], ${'(long)' if T == 'double' else '(int)'} (${out} > (${T}) 0 && ${out} < (${T}) 6))
% elif RELU:
select((${T}) 0, dy[dy_off + ${i}], ${'(long)' if T == 'double' else '(int)'} (y[y_off + ${i}] > (${T}) 0))
% else:
dy[dy_off + ${i}]
% endif
</%def>

/* masked_grad for RUN_LANES consecutive elements from i, as an accumulator vector (a vector ternary is a
   select: a vector comparison's lanes are all ones when true). */
<%def name="masked_grad_lanes(i)">
<% out = wide_load("y + y_off + " + i) %>
% if RELU6:
((${out} > (${AV}) 0 & ${out} < (${AV}) 6) ? ${wide_load("dy + dy_off + " + i)} : (${AV}) 0)
% elif RELU:
(${wide_load("y + y_off + " + i)} > (${AV}) 0 ? ${wide_load("dy + dy_off + " + i)} : (${AV}) 0)
% else:
${wide_load("dy + dy_off + " + i)}
% endif
</%def>

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void bn_backward_reduce(
    __global const ${T}* x, const long x_off,
    __global const ${T}* y, const long y_off,
    __global const ${T}* dy, const long dy_off,
    __global const ${T}* mean, const long mean_off, __global const ${T}* var, const long var_off,
    __global ${T}* grad_weight, const long gw_off, __global ${T}* grad_bias, const long gb_off,
    const int N, const int C, const int L, const int parts, const ${T} eps)
{
    __local ${ACC} sum_dz[${LOCAL}];
    __local ${ACC} sum_dz_xmu[${LOCAL}];
    const int l = get_local_id(0);
    const int c = get_group_id(0);
    const ${ACC} mu = (${ACC}) mean[mean_off + c];
    ${ACC} a = 0, b = 0;
% if RUN_LANES > 1:
    ${AV} lanes_a = (${AV}) 0, lanes_b = (${AV}) 0;
% endif
    ${channel_loop("const " + ACC + " dz = (" + ACC + ") " + capture(masked_grad, "i").strip() + "; a += dz; b += dz * ((" + ACC + ") x[x_off + i] - mu);",
                   "const " + AV + " dz = " + capture(masked_grad_lanes, "i").strip() + "; lanes_a += dz; lanes_b += dz * (" + wide_load("x + x_off + i") + " - mu);")}
% if RUN_LANES > 1:
    a += ${lane_sum("lanes_a")};
    b += ${lane_sum("lanes_b")};
% endif
    sum_dz[l] = a;
    sum_dz_xmu[l] = b;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = ${LOCAL // 2}; span > 0; span >>= 1) {
        if (l < span) {
            sum_dz[l] += sum_dz[l + span];
            sum_dz_xmu[l] += sum_dz_xmu[l + span];
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (l == 0) {
        grad_bias[gb_off + c] = (${T}) sum_dz[0];
        grad_weight[gw_off + c] = (${T}) (sum_dz_xmu[0] * (${ACC}) rsqrt(var[var_off + c] + eps));
    }
}

__kernel void bn_backward_apply(
    __global const ${T}* restrict x, const long x_off,
    __global const ${T}* restrict y, const long y_off,
    __global const ${T}* restrict dy, const long dy_off,
    __global const ${T}* restrict mean, const long mean_off, __global const ${T}* restrict var, const long var_off,
    __global const ${T}* restrict weight, const long w_off, __global const ${T}* restrict bias, const long b_off,
    __global const ${T}* restrict sum_dz_xhat, const long sx_off, __global const ${T}* restrict sum_dz, const long sd_off,
    __global ${T}* restrict dx, const long dx_off,
    __global ${T}* restrict dr, const long dr_off,
    const int NC, const int C, const int L, const int chunk, const long M, const ${T} eps)
{
    const int j0 = get_global_id(0) * chunk;
    const int plane = get_global_id(1);
    if (j0 >= L || plane >= NC) return;
    ${channel_constants()}
    const ${T} k = gamma * invstd;
% if BATCH_STATS:
    const ${T} inv_m = (${T}) 1 / (${T}) M;
    const ${T} mean_dz = sum_dz[sd_off + c] * inv_m, mean_dz_xhat = sum_dz_xhat[sx_off + c] * inv_m;
% endif
    const int j1 = min(L, j0 + chunk);
    for (int j = j0; j < j1; ++j) {
        const long i = (long) plane * L + j;
        const ${T} dz = ${masked_grad("i")};
% if RESIDUAL:
        dr[dr_off + i] = dz;
% endif
% if BATCH_STATS:
        const ${T} xhat = (x[x_off + i] - mu) * invstd;
        dx[dx_off + i] = k * (dz - mean_dz - xhat * mean_dz_xhat);
% else:
        dx[dx_off + i] = dz * k;
% endif
    }
}

__kernel void bn_fold(
    __global const ${T}* restrict conv_w, const long cw_off, __global const ${T}* restrict conv_b, const long cb_off,
    __global const ${T}* restrict mean, const long mean_off, __global const ${T}* restrict var, const long var_off,
    __global const ${T}* restrict weight, const long w_off, __global const ${T}* restrict bias, const long b_off,
    __global ${T}* restrict folded_w, const long fw_off, __global ${T}* restrict folded_b, const long fb_off,
    const int K, const int S, const ${T} eps)
{
    const int s = get_global_id(0);
    const int plane = get_global_id(1);
    if (s >= S || plane >= K) return;
    const int C = K;
    ${channel_constants()}
    const ${T} scale = gamma * invstd;
    const long i = (long) plane * S + s;
    folded_w[fw_off + i] = conv_w[cw_off + i] * scale;
    if (s == 0) {
% if CONV_BIAS:
        folded_b[fb_off + plane] = beta + scale * (conv_b[cb_off + plane] - mu);
% else:
        folded_b[fb_off + plane] = beta - scale * mu;
% endif
    }
}
