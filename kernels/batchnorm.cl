<%doc>
Batch normalization over channels: x viewed as (N, C, L) contiguous from its offset (L = H*W for
BatchNorm2d, L = 1 or the length for BatchNorm1d). M = N*L values per channel.

Forward (two or three launches):
  bn_stats     one pass over each block of a channel (see the reduction geometry below): the sums of
               d = x - shift and of d^2, the shift being the block's first element, give the block's mean
               and m2 = sum (x - mean)^2 = S2 - S1^2 / n. Shifting by a value of the data keeps the
               variance of data with a large mean (no cancellation of E[x^2] - E[x]^2).
               Without SPLIT (one block per channel) it writes the statistics; with SPLIT it writes each
               block's (mean, m2) to `partials` (ACC, 2 per block, channel-major) and
  bn_stats_merge  one item per channel merges its blocks in block order (Chan et al.'s update:
               delta = mean_b - mean_a, mean += delta n_b / n, m2 += m2_b + delta^2 n_a n_b / n).
               Either writes mean, the biased variance m2 / M and, with UPDATE_RUNNING, the running
               statistics:
                 factor = CUMULATIVE ? 1 / (num_batches_tracked + 1) : momentum
                 running_mean = (1 - factor) running_mean + factor mean
                 running_var  = (1 - factor) running_var  + factor m2 / (M - 1)   (unbiased)
               They only read num_batches_tracked; bn_apply's COUNT increments it afterwards (the items
               run in no fixed order, so none of them can both read and write it).
  bn_apply     one work-item per `chunk` consecutive elements of a row (a runtime argument: the whole row,
               or a long run of it, on CPUs, where the item's loop runs on RUN_LANES-wide vectors and the
               channel constants are computed once; 1 elsewhere), global (ceil(L / chunk), N*C):
                 z = (x - mean[c]) * rsqrt(var[c] + eps) * weight[c] + bias[c]  (+ r)   ;  y = RELU ? max(z, 0) : z
               (RELU6: y = min(max(z, 0), 6); the activations' text is netcl.runtime.cl_activation's, which
               the convolutions' fused epilogues share)
               mean/var are the batch statistics in training and the running ones in eval.
Inference with a folded convolution (netcl.nn.fusion): bn_fold computes, per output channel k of the
convolution before the BatchNorm, s = weight[k] * rsqrt(running_var[k] + eps),
  folded_w[k, :] = s * conv_w[k, :],  folded_b[k] = bias[k] + s * (conv_b[k] - running_mean[k])
(one item per `chunk` elements of a channel's weights, as bn_apply), and bn_apply with SHIFT_ONLY adds folded_b (plus r, then the ReLU) to the
folded convolution's output in one pass.
Backward (two or three launches), with dz = RELU ? (y > 0 ? dy : 0) : dy (the mask comes from the saved
output y; RELU6: 0 < y < 6, PyTorch's hardtanh_backward, which passes nothing at either bound):
  bn_backward_reduce  per block: sum dz and sum dz * (x - mean); without SPLIT they are channel c's, and
               it writes grad_bias[c] = sum dz, grad_weight[c] = invstd * sum dz * (x - mean); with SPLIT
               it writes them to `partials` and
  bn_backward_merge   one item per channel adds its blocks' sums in block order and writes the same.
  bn_backward_apply   one work-item per `chunk` elements, as bn_apply:
                 BATCH_STATS: dx = weight[c] * invstd * (dz - (sum dz + xhat * sum dz*xhat) / M)
                 else (running statistics are constants): dx = dz * weight[c] * invstd
               and with RESIDUAL it also writes dr = dz (the gradient of the residual input).
No atomics anywhere and a fixed merge order: the same input gives the same bits.

Reduction geometry (bn_stats, bn_backward_reduce; runtime arguments): each channel's N rows of L elements
are cut into blocks of `rows_per_block` rows by `seg` columns (`segments` per row), numbered row block
major. With LOCAL > 1 a work-group of LOCAL items reduces one block, global (blocks * LOCAL, C): `parts`
items share each row (LOCAL / parts rows in flight), interleaved so consecutive items read consecutive
addresses (GPUs: coalesced loads), and a tree sum combines them. With LOCAL = 1 an item has a block of its
own, global (blocks, C rounded up): with ITEM_RUNS it reads each row of the block as one contiguous run
(CPUs: a sequential, cache-friendly loop), summed a sub-run of RUN_LANES-wide vectors at a time in the
element type and added into the ACC accumulators. No item divides an index per element.
The elementwise kernels mark their pointers restrict, so the per-channel constants (uniform across a
work-group) can be hoisted out of PoCL's work-item loops.

Template parameters (all have defaults):
  T               C element type of x, y, the statistics and the parameters         (default "float")
  ACC             C type of the accumulators                                          (default "float")
  LOCAL           items reducing one block together, a power of two (1: an item a block) (default 64)
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
                  independent accumulators, and the apply kernels' loops step as many elements (element
                  loads and stores that LLVM merges into vector ones; 1: one scalar chain, which is
                  bound by the add's latency, not by memory)                          (default 1)
  SHIFT_ONLY      bn_apply adds bias[c] only (the folded convolution's epilogue)      (default False)
  CONV_BIAS       bn_fold: the convolution has a bias                                 (default False)
  SPLIT           bn_stats / bn_backward_reduce write per-block partial results for the
                  merge kernels (several blocks per channel) instead of the final ones  (default False)
</%doc>
<%page args="T='float', ACC='float', LOCAL=64, AFFINE=True, RELU=False, RELU6=False, HARDSWISH=False, RESIDUAL=False, UPDATE_RUNNING=False, CUMULATIVE=False, COUNT=False, BATCH_STATS=True, ITEM_RUNS=True, RUN_LANES=1, SHIFT_ONLY=False, CONV_BIAS=False, SPLIT=False"/>
% if T == 'double' or ACC == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

<%! from netcl.runtime import cl_vectors %>
<%! from netcl.runtime.cl_activation import apply_activation %>
<%
    # a run's lanes hold the element type: a sub-run of SUB_RUN vectors is summed in it, then added into the
    # accumulators (the widening conversion per element kept the double form compute-bound)
    SUB_RUN = 16
    TV = f"{T}{RUN_LANES}"
    # bn_apply's activation (netcl.runtime.cl_activation holds its text, shared with the convolutions' epilogues)
    ACTIVATION = "hardswish" if HARDSWISH else ("relu6" if RELU6 else ("relu" if RELU else "none"))
    def wide_load(pointer):
        # RUN_LANES elements as one vector from element loads: no vloadN built-in (netcl.runtime.cl_vectors
        # says why)
        return cl_vectors.vload(TV, RUN_LANES, pointer)
    def lane_sum(v):
        return "(" + " + ".join(f"{v}.s{k:x}" for k in range(RUN_LANES)) + ")" if RUN_LANES > 1 else v
%>

/* A reduction's groups cooperate on one block when LOCAL > 1; with LOCAL = 1 each item has a block of
   its own and a group holds the blocks of several channels (one item per group made the group's
   scheduling cost more than a small block's reading). */
<%def name="group_size_attribute()">
% if LOCAL > 1:
__attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
% endif
</%def>

/* The block of channel c that work-group `part` of the reductions covers: rows [n0, n1) of the batch and
   columns [j0, j1) of each row (see "Reduction geometry" above), and its element count. */
<%def name="block_bounds()">
% if LOCAL > 1:
    const int block = get_group_id(0), c = get_group_id(1);
% else:
    const int block = get_global_id(0), c = get_global_id(1);
    if (c >= C) return;
% endif
    const int n0 = (block / segments) * rows_per_block, n1 = min(N, n0 + rows_per_block);
    const int j0 = (block % segments) * seg, j1 = min(L, j0 + seg);
    const int blocks = (N + rows_per_block - 1) / rows_per_block * segments;
</%def>

/* The element count of block `b` of a channel, from the same geometry (the merge kernels' weights). */
<%def name="block_count(b)">
    ((long) (min(N, (${b} / segments) * rows_per_block + rows_per_block) - (${b} / segments) * rows_per_block) *
     (min(L, (${b} % segments) * seg + seg) - (${b} % segments) * seg))
</%def>

/* Visit every element of the group's block: `body` sees the element's index `i`. The runtime argument
   `parts` says how many items share one row (LOCAL / parts rows are in flight at a time). */
<%def name="block_loop(body, vector_body='', vector_open='', vector_flush='')">
    {
        const int rows_per_step = ${LOCAL} / parts, row0 = l / parts, part = l % parts;
        if (row0 < rows_per_step) {
% if ITEM_RUNS:
            const int run = (j1 - j0 + parts - 1) / parts;
            const int r0 = j0 + part * run, r1 = min(j1, r0 + run);
% endif
            for (int n = n0 + row0; n < n1; n += rows_per_step) {
                const long base = ((long) n * C + c) * L;
% if ITEM_RUNS:
                int j = r0;
  % if RUN_LANES > 1 and vector_body:
                while (j + ${RUN_LANES} <= r1) {
                    const int stop = min(r1, j + ${SUB_RUN * RUN_LANES});
                    ${vector_open}
                    for (; j + ${RUN_LANES} <= stop; j += ${RUN_LANES}) {
                        const long i = base + j;
                        ${vector_body}
                    }
                    ${vector_flush}
                }
  % endif
                for (; j < r1; ++j) {
% else:
                for (int j = j0 + part; j < j1; j += parts) {
% endif
                    const long i = base + j;
                    ${body}
                }
            }
        }
    }
</%def>

/* Tree sums of the group's `names` (local arrays already holding each item's value) into element 0. */
<%def name="tree_sums(*names)">
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int span = ${LOCAL // 2}; span > 0; span >>= 1) {
        if (l < span) {
% for name in names:
            ${name}[l] += ${name}[l + span];
% endfor
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
</%def>

/* Channel c's mean `mu` and sum of squared deviations `m2` over its M values become the statistics. */
<%def name="finish_stats(mu, m2)">
        mean[mean_off + c] = (${T}) (${mu});
        var[var_off + c] = (${T}) ((${m2}) / (${ACC}) M);
% if UPDATE_RUNNING:
  % if CUMULATIVE:
        const ${ACC} factor = (${ACC}) 1 / (${ACC}) (num_batches_tracked[nbt_off] + 1);
  % else:
        const ${ACC} factor = (${ACC}) momentum;
  % endif
        const ${ACC} unbiased = (${m2}) / (${ACC}) (M - 1);
        running_mean[rm_off + c] = (${T}) ((1 - factor) * (${ACC}) running_mean[rm_off + c] + factor * (${mu}));
        running_var[rv_off + c] = (${T}) ((1 - factor) * (${ACC}) running_var[rv_off + c] + factor * unbiased);
% endif
</%def>

<%def name="stats_arguments()">
    __global ${T}* mean, const long mean_off, __global ${T}* var, const long var_off,
    __global ${T}* running_mean, const long rm_off, __global ${T}* running_var, const long rv_off,
    __global const long* num_batches_tracked, const long nbt_off,
</%def>

/* One pass over each block: sums of x - shift and of its square, the shift being the block's first
   element. Any value of the block keeps the sum of squares within a few of the block's own spread of
   its deviation sum, so m2 = S2 - S1^2/n loses no more than the two-pass form would, whatever the mean. */
__kernel ${group_size_attribute()}
void bn_stats(
    __global const ${T}* x, const long x_off,
    ${stats_arguments()}
    __global ${ACC}* partials, const long partials_off,
    const int N, const int C, const int L, const int rows_per_block, const int segments, const int seg,
    const int parts, const ${T} momentum)
{
% if LOCAL > 1:
    __local ${ACC} sum_d[${LOCAL}], sum_dd[${LOCAL}];
% endif
    const int l = get_local_id(0);
    ${block_bounds()}
    const long M = (long) N * L;
    __global const ${T}* xs = x + x_off;
    const ${ACC} shift = (${ACC}) xs[((long) n0 * C + c) * L + j0];  // exact in the element type too

    const ${T} lane_shift = (${T}) shift;
    ${ACC} s1 = 0, s2 = 0;
    ${block_loop("const " + ACC + " d = (" + ACC + ") xs[i] - shift; s1 += d; s2 += d * d;",
                 "const " + TV + " d = " + wide_load("xs + i") + " - lane_shift; lanes1 += d; lanes2 += d * d;",
                 TV + " lanes1 = (" + TV + ") 0, lanes2 = (" + TV + ") 0;",
                 "s1 += (" + ACC + ") " + lane_sum("lanes1") + "; s2 += (" + ACC + ") " + lane_sum("lanes2") + ";")}
% if LOCAL > 1:
    sum_d[l] = s1;
    sum_dd[l] = s2;
    ${tree_sums("sum_d", "sum_dd")}
    s1 = sum_d[0];
    s2 = sum_dd[0];
% endif
    if (l == 0) {
        const ${ACC} count = (${ACC}) ((long) (n1 - n0) * (j1 - j0));
        const ${ACC} mu = shift + s1 / count;
        const ${ACC} m2 = max(s2 - s1 * (s1 / count), (${ACC}) 0);
% if SPLIT:
        const long at = partials_off + 2 * ((long) c * blocks + block);
        partials[at] = mu;
        partials[at + 1] = m2;
% else:
        ${finish_stats("mu", "m2")}
% endif
    }
}

/* The blocks' (mean, m2) of each channel merged in block order (Chan et al.'s pairwise update, exact
   for any spread of the block means), one item per channel. */
__kernel void bn_stats_merge(
    ${stats_arguments()}
    __global const ${ACC}* partials, const long partials_off,
    const int N, const int C, const int L, const int rows_per_block, const int segments, const int seg,
    const int blocks, const ${T} momentum)
{
    const int c = get_global_id(0);
    if (c >= C) return;
    const long M = (long) N * L;
    __global const ${ACC}* ps = partials + partials_off + 2 * (long) c * blocks;
    ${ACC} count = 0, mu = 0, m2 = 0;
    for (int b = 0; b < blocks; ++b) {
        const ${ACC} nb = (${ACC}) ${block_count("b").strip()};
        const ${ACC} total = count + nb, delta = ps[2 * b] - mu;
        mu += delta * (nb / total);
        m2 += ps[2 * b + 1] + delta * delta * (count * nb / total);
        count = total;
    }
    ${finish_stats("mu", "m2")}
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

/* bn_apply's output at the `width` elements from index i, in the type V (T or its vector of `width`). */
<%def name="apply_element(V, width)">
        ${V} z = ${cl_vectors.vload(V, width, "x + x_off + i")} * scale + shift;
% if RESIDUAL:
        z += ${cl_vectors.vload(V, width, "r + r_off + i")};
% endif
        ${apply_activation(ACTIVATION, "z", V)}
        ${cl_vectors.vstore("z", width, "y + y_off + i")}
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
    int j = j0;
% if RUN_LANES > 1:
    for (; j + ${RUN_LANES} <= j1; j += ${RUN_LANES}) {
        const long i = (long) plane * L + j;
        ${apply_element(TV, RUN_LANES)}
    }
% endif
    for (; j < j1; ++j) {
        const long i = (long) plane * L + j;
        ${apply_element(T, 1)}
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
((${out} > (${TV}) 0 & ${out} < (${TV}) 6) ? ${wide_load("dy + dy_off + " + i)} : (${TV}) 0)
% elif RELU:
(${wide_load("y + y_off + " + i)} > (${TV}) 0 ? ${wide_load("dy + dy_off + " + i)} : (${TV}) 0)
% else:
${wide_load("dy + dy_off + " + i)}
% endif
</%def>

/* grad_bias = sum dz and grad_weight = invstd * sum dz (x - mean) of channel c, from its sums `a`, `b`. */
<%def name="finish_backward(a, b)">
        grad_bias[gb_off + c] = (${T}) (${a});
        grad_weight[gw_off + c] = (${T}) ((${b}) * (${ACC}) rsqrt(var[var_off + c] + eps));
</%def>

__kernel ${group_size_attribute()}
void bn_backward_reduce(
    __global const ${T}* x, const long x_off,
    __global const ${T}* y, const long y_off,
    __global const ${T}* dy, const long dy_off,
    __global const ${T}* mean, const long mean_off, __global const ${T}* var, const long var_off,
    __global ${T}* grad_weight, const long gw_off, __global ${T}* grad_bias, const long gb_off,
    __global ${ACC}* partials, const long partials_off,
    const int N, const int C, const int L, const int rows_per_block, const int segments, const int seg,
    const int parts, const ${T} eps)
{
% if LOCAL > 1:
    __local ${ACC} sum_dz[${LOCAL}], sum_dz_xmu[${LOCAL}];
% endif
    const int l = get_local_id(0);
    ${block_bounds()}
    const ${ACC} mu = (${ACC}) mean[mean_off + c];
    const ${T} lane_mu = mean[mean_off + c];
    ${ACC} a = 0, b = 0;
    ${block_loop("const " + ACC + " dz = (" + ACC + ") " + capture(masked_grad, "i").strip() + "; a += dz; b += dz * ((" + ACC + ") x[x_off + i] - mu);",
                 "const " + TV + " dz = " + capture(masked_grad_lanes, "i").strip() + "; lanes_a += dz; lanes_b += dz * (" + wide_load("x + x_off + i") + " - lane_mu);",
                 TV + " lanes_a = (" + TV + ") 0, lanes_b = (" + TV + ") 0;",
                 "a += (" + ACC + ") " + lane_sum("lanes_a") + "; b += (" + ACC + ") " + lane_sum("lanes_b") + ";")}
% if LOCAL > 1:
    sum_dz[l] = a;
    sum_dz_xmu[l] = b;
    ${tree_sums("sum_dz", "sum_dz_xmu")}
    a = sum_dz[0];
    b = sum_dz_xmu[0];
% endif
    if (l == 0) {
% if SPLIT:
        const long at = partials_off + 2 * ((long) c * blocks + block);
        partials[at] = a;
        partials[at + 1] = b;
% else:
        ${finish_backward("a", "b")}
% endif
    }
}

/* The blocks' sums of each channel added in block order, one item per channel. */
__kernel void bn_backward_merge(
    __global const ${T}* var, const long var_off,
    __global ${T}* grad_weight, const long gw_off, __global ${T}* grad_bias, const long gb_off,
    __global const ${ACC}* partials, const long partials_off,
    const int C, const int blocks, const ${T} eps)
{
    const int c = get_global_id(0);
    if (c >= C) return;
    __global const ${ACC}* ps = partials + partials_off + 2 * (long) c * blocks;
    ${ACC} a = 0, b = 0;
    for (int k = 0; k < blocks; ++k) {
        a += ps[2 * k];
        b += ps[2 * k + 1];
    }
    ${finish_backward("a", "b")}
}

/* bn_backward_apply's gradients at the `width` elements from index i, given their dz, in the type V. */
<%def name="backward_element(V, width)">
% if RESIDUAL:
        ${cl_vectors.vstore("dz", width, "dr + dr_off + i")}
% endif
% if BATCH_STATS:
        const ${V} xhat = (${cl_vectors.vload(V, width, "x + x_off + i")} - mu) * invstd;
        const ${V} g = k * (dz - mean_dz - xhat * mean_dz_xhat);
% else:
        const ${V} g = dz * k;
% endif
        ${cl_vectors.vstore("g", width, "dx + dx_off + i")}
</%def>

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
    int j = j0;
% if RUN_LANES > 1:
    for (; j + ${RUN_LANES} <= j1; j += ${RUN_LANES}) {
        const long i = (long) plane * L + j;
        const ${TV} dz = ${capture(masked_grad_lanes, "i").strip()};
        ${backward_element(TV, RUN_LANES)}
    }
% endif
    for (; j < j1; ++j) {
        const long i = (long) plane * L + j;
        const ${T} dz = ${masked_grad("i")};
        ${backward_element(T, 1)}
    }
}

__kernel void bn_fold(
    __global const ${T}* restrict conv_w, const long cw_off, __global const ${T}* restrict conv_b, const long cb_off,
    __global const ${T}* restrict mean, const long mean_off, __global const ${T}* restrict var, const long var_off,
    __global const ${T}* restrict weight, const long w_off, __global const ${T}* restrict bias, const long b_off,
    __global ${T}* restrict folded_w, const long fw_off, __global ${T}* restrict folded_b, const long fb_off,
    const int K, const int S, const int chunk, const ${T} eps)
{
    const int s0 = get_global_id(0) * chunk;
    const int plane = get_global_id(1);
    if (s0 >= S || plane >= K) return;
    const int C = K;
    ${channel_constants()}
    const ${T} scale = gamma * invstd;
    const int s1 = min(S, s0 + chunk);
    int s = s0;
% if RUN_LANES > 1:
    for (; s + ${RUN_LANES} <= s1; s += ${RUN_LANES}) {
        const long i = (long) plane * S + s;
        ${cl_vectors.vstore(cl_vectors.vload(TV, RUN_LANES, "conv_w + cw_off + i") + " * scale", RUN_LANES, "folded_w + fw_off + i")}
    }
% endif
    for (; s < s1; ++s) {
        const long i = (long) plane * S + s;
        folded_w[fw_off + i] = conv_w[cw_off + i] * scale;
    }
    if (s0 == 0) {
% if CONV_BIAS:
        folded_b[fb_off + plane] = beta + scale * (conv_b[cb_off + plane] - mu);
% else:
        folded_b[fb_off + plane] = beta - scale * mu;
% endif
    }
}
