<%doc>
Pointwise convolution (the `pointwise` strategy): a 1×1 kernel, stride 1, no padding, NCHW tensors, weight
(K, C/G, 1, 1), G groups. Every pass is a product whose operands the kernels read in place, one row of
an operand being one channel plane of PQ = H·W consecutive elements:

  pointwise_forward         y[n, g·KG + m, p] = act(Σ_i w[g·KG + m, i] · x[n, g·CG + i, p] + bias + residual)
  pointwise_backward_data   gx[n, g·CG + m, p] = Σ_i w[g·KG + i, m] · gy[n, g·KG + i, p]
  pointwise_backward_weight gw[g·KG + k, c] = Σ_{n, p} gy[n, g·KG + k, p] · x[n, g·CG + c, p]

(KG = K/G, CG = C/G). The first two are one kernel: a work-item owns VW adjacent pixels of one plane (one
vector T<VW>) and TM rows (output channels), all TM accumulators in registers for the whole inner
dimension; per inner index it loads one vector of the plane and multiplies it with TM weights. No
lowering, no tables, no local memory: the index arithmetic is one multiply-add per load, which is what
sets these layers apart from implicit GEMM's gather (a 1×1 layer's inner dimension is short, so the
gather's tables cost as much as the products). A last vector that would run past the plane is moved
back to end where the plane ends (its first pixels are computed twice, with the same result), so no
load or store is masked; the host makes VW ≤ PQ. Rows past the last are computed from the last real
row's weights and never stored.

backward_weight is a dot product over the N·PQ pixels for each (k, c): a work-item owns TM rows k and TC
columns c, TM·TC vector accumulators over VW pixel lanes, loads TM gradient and TC input vectors per VW
pixels, and sums its lanes at the end. A plane's last vector is moved back like the others with the
lanes already counted masked to zero. Each gradient element is written once: no atomics, no workspace,
deterministic.

A CPU runs work-groups of one work-item (its compiler keeps the vectors as written); a GPU runs VW = 1
with L work-items of adjacent pixels per group (coalesced loads).

Template parameters (all have defaults):
  KERNEL    "forward", "backward_data" or "backward_weight"                          (default "forward")
  T         element type, "float" or "double"                                        (default "float")
  VW        pixels per work-item, one vector: 1, 2, 4, 8 or 16                        (default 16)
  TM        rows (output channels; backward_weight: gradient rows k) per work-item    (default 8)
  TC        backward_weight: input channels c per work-item                          (default 4)
  PIXELS_FIRST  forward, backward_data: the launch's first dimension counts pixel vectors, the second
            row tiles (a GPU: adjacent work-items read adjacent pixels; a CPU, which runs the first
            dimension innermost, where the product has more result rows than inner ones: each row
            tile's planes are written front to back); else the other way round (a CPU's other
            products: a vector's row tiles run one after another while its inputs are in cache)
                                                                                     (default True)
  BIAS      forward: add bias[g·KG + m] to every output of that channel              (default False)
  RESIDUAL  forward: then add residual (a tensor of the output's shape) at the output's index
                                                                                     (default False)
  ACT       forward: then apply "none", "relu", "relu6" or "hardswish" (an inference epilogue: the text is
            netcl.runtime.cl_activation's, so the result has the bits of the separate pass
            kernels/batchnorm.cl's bn_apply makes)                                   (default "none")

Arguments: A, B, the output (buffer, offset each): (weight, x, y) forward, (weight, gy, gx) backward_data,
(gy, x, gw) backward_weight; the bias and the residual (buffer, offset; any buffer where unused); then
the ints MD (rows of a group's result: KG, CG, KG), KD (its inner dimension: CG, KG, and CG for
backward_weight's columns), PQ, and N (backward_weight) or G.

Launch: forward and backward_data global (L · ceil(ceil(PQ / VW) / L), ceil(MD / TM), N·G), local
(L, 1, 1), the first two swapped without PIXELS_FIRST; backward_weight global (ceil(CG / TC), ceil(KG / TM), G), local (1, 1, 1).

No OpenCL built-in function that takes or returns a vector is called (netcl.runtime.cl_vectors says why).
</%doc>
<%page args="KERNEL='forward', T='float', VW=16, TM=8, TC=4, PIXELS_FIRST=True, BIAS=False, RESIDUAL=False, ACT='none'"/>
<%! from netcl.runtime.cl_vectors import vload, vstore, lesser %>
<%! from netcl.runtime.cl_activation import apply_epilogue %>
<%
    VT = T if VW == 1 else T + str(VW)
    IT = ("int" if T == "float" else "long") + ("" if VW == 1 else str(VW))

    def lane_sum(value):
        if VW == 1:
            return value
        return " + ".join("(%s).s%x" % (value, j) for j in range(VW))
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

% if KERNEL in ('forward', 'backward_data'):
__kernel void pointwise_${KERNEL}(
    __global const ${T}* A, const long a_off,
    __global const ${T}* B, const long b_off,
    __global ${T}* Out, const long out_off,
    __global const ${T}* bias, const long bias_off,
    __global const ${T}* residual, const long residual_off,
    const int MD, const int KD, const int PQ, const int G)
{
% if PIXELS_FIRST:
    int p0 = get_global_id(0) * ${VW};
    const int m0 = get_group_id(1) * ${TM};
% else:
    int p0 = get_group_id(1) * ${VW};
    const int m0 = get_group_id(0) * ${TM};
% endif
    if (p0 >= PQ)
        return;
    if (p0 + ${VW} > PQ)
        p0 = PQ - ${VW};  // moved back: the plane's last vector
    const int plane = get_group_id(2), g = plane % G;
    const int rows = ${lesser(str(TM), '(MD - m0)')};
% if KERNEL == 'forward':
    const long a_row = KD, a_inner = 1;  // w[g·KG + m, i]
% else:
    const long a_row = 1, a_inner = MD;  // w[g·KG + i, m]
% endif
% for m in range(TM):
    __global const ${T}* a${m} = A + a_off + (long)g * MD * KD + (long)(m0 + ${lesser(str(m), '(rows - 1)')}) * a_row;
% endfor
    __global const ${T}* src = B + b_off + (long)plane * KD * PQ + p0;

% for m in range(TM):
    ${VT} acc${m} = (${VT})(0);
% endfor
    for (int i = 0; i < KD; ++i) {
        const ${VT} bv = ${vload(VT, VW, 'src + (long)i * PQ')};
        const long ai = i * a_inner;
% for m in range(TM):
        acc${m} = (${VT})(a${m}[ai]) * bv + acc${m};
% endfor
    }

    const long out_base = (long)plane * MD * PQ + p0 + (long)m0 * PQ;
% for m in range(TM):
    if (${m} < rows) {
% if KERNEL == 'forward':
        ${apply_epilogue("acc%d" % m, VT,
                         bias=("bias[bias_off + g * MD + m0 + %d]" % m) if BIAS else None,
                         residual=vload(VT, VW, "residual + residual_off + out_base + %d * (long)PQ" % m) if RESIDUAL else None,
                         activation=ACT)}
% endif
        ${vstore("acc%d" % m, VW, "Out + out_off + out_base + %d * (long)PQ" % m)}
    }
% endfor
}
% else:
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void pointwise_backward_weight(
    __global const ${T}* A, const long a_off,
    __global const ${T}* B, const long b_off,
    __global ${T}* Out, const long out_off,
    __global const ${T}* bias, const long bias_off,
    __global const ${T}* residual, const long residual_off,
    const int KG, const int CG, const int PQ, const int N)
{
    const int G = get_num_groups(2), g = get_group_id(2);
    const int c0 = get_group_id(0) * ${TC}, k0 = get_group_id(1) * ${TM};
    const int cols = ${lesser(str(TC), '(CG - c0)')}, rows = ${lesser(str(TM), '(KG - k0)')};
    // rows and columns past the last read the last real one and are never stored
% for m in range(TM):
    const long gy_row${m} = ((long)g * KG + k0 + ${lesser(str(m), '(rows - 1)')}) * PQ;
% endfor
% for c in range(TC):
    const long x_row${c} = ((long)g * CG + c0 + ${lesser(str(c), '(cols - 1)')}) * PQ;
% endfor
% for m in range(TM):
% for c in range(TC):
    ${VT} acc${m}_${c} = (${VT})(0);
% endfor
% endfor
% if VW > 1:
    const ${IT} lane = (${IT})(${", ".join(str(j) for j in range(VW))});
% endif
    for (int n = 0; n < N; ++n) {
        __global const ${T}* gy = A + a_off + (long)n * G * KG * PQ;
        __global const ${T}* x = B + b_off + (long)n * G * CG * PQ;
        for (int p = 0; p < PQ; p += ${VW}) {
            const int p0 = p + ${VW} > PQ ? PQ - ${VW} : p;  // moved back: lanes below p - p0 were counted
% for m in range(TM):
            const ${VT} gv${m} = ${vload(VT, VW, 'gy + gy_row%d + p0' % m)};
% endfor
% for c in range(TC):
% if VW > 1:
            const ${VT} xv${c} = lane >= (${IT})(p - p0) ? ${vload(VT, VW, 'x + x_row%d + p0' % c)} : (${VT})(0);
% else:
            const ${VT} xv${c} = x[x_row${c} + p0];
% endif
% endfor
% for m in range(TM):
% for c in range(TC):
            acc${m}_${c} = gv${m} * xv${c} + acc${m}_${c};
% endfor
% endfor
        }
    }
% for m in range(TM):
% for c in range(TC):
    if (${m} < rows && ${c} < cols)
        Out[out_off + ((long)g * KG + k0 + ${m}) * CG + c0 + ${c}] = ${lane_sum("acc%d_%d" % (m, c))};
% endfor
% endfor
}
% endif
