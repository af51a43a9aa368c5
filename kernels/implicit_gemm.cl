<%doc>
Implicit-GEMM convolution (NCHW input, KCRS weight, grouped): one tiled GEMM per pass whose B tiles are
gathered straight from the input (or output-gradient) tensor into local memory. No lowered matrix
exists anywhere: the only extra memory is the work-group's local tiles and index tables.

Every pass is C[m, j] = sum_i A[m, i] * B[i, j] over one group (get_group_id(2) = group index):

  MODE            rows m        columns j         inner i          A            B (gathered)
  forward         k  (K/G)      (n, p, q)         (c, r, s)        weight       x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]
  backward_data   c  (C/G)      (n, h', w')       (k, r, s) valid  weight       gy[n, k, h' + (a+PH-r*DH)/SH, w' + (b+PW-s*DW)/SW]
  backward_weight k  (K/G)      (c, r, s)         (n, p, q)        grad_y       x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]

backward_data runs one GEMM per residue class (a, b) = (h mod SH, w mod SW) of the input positions
(get_group_id(2) = group * SH*SW + class; h = h'*SH + a, w = w'*SW + b): in a class exactly the taps
r with (a + PH - r*DH) divisible by SH (every SH/gcd(SH, DH)-th r from the first) and likewise s reach
an output-gradient element, so the inner dimension holds only those, and none of the work is wasted on
taps a stride skips. With stride 1 there is one class and every tap.

B's address splits into a column part and an inner part (offset, row, column), so each tile first
decomposes its TN columns once and each panel its TK inner indices into tables; the gather itself then
needs only additions and a bounds test. Fast paths: a work-item's TN columns that read TN consecutive
elements of one source row (stride 1 along the width, not cut by a border) are gathered with one vector
load per inner index, and A, read in place, is indexed directly when the panel's inner indices are
consecutive in its rows (always in forward).

`geom` is an int64 array [N, C, H, W, K, R, S, P, Q, SH, SW, PH, PW, DH, DW, G] (P, Q = output size).

Template parameters (all have defaults):
  T      element type, "float" or "double"                           (default "float")
  MODE   "forward", "backward_data" or "backward_weight"             (default "forward")
  TM     rows of C per work-group tile, a multiple of 4               (default 64)
  TN     columns of C per tile, held as one vector T<TN>: 4, 8 or 16  (default 16)
  TK     inner-dimension panel gathered into local memory per step, any size (default 512)
  BIAS   forward: add bias[k] to every output of channel k as it is stored, which saves the
         separate pass over the output (kernels/bias.cl) (default False)
  RESIDUAL  forward: then add the element of `residual` (a tensor of the output's shape) at the
         output's index                                              (default False)
  ACT    forward: then apply "none", "relu", "relu6" or "hardswish" (an inference epilogue:
         z = acc + bias; z += residual; activation; the text is netcl.runtime.cl_activation's, so the
         result has the bits of the separate pass kernels/batchnorm.cl's bn_apply makes) (default "none")

Arguments: A, B, the output (buffer, offset each), geom, then the bias and the residual (buffer, offset;
any buffer where unused).

Launch: global (ceil(cols/TN), ceil(rows/TM), G), local (1, 1, 1). A work-group is one work-item: on
PoCL's CPU driver a work-group of several work-items with barriers keeps every value that lives
across a barrier in memory and runs the multiply-add loop several times slower, while a single
work-item keeps its accumulators in registers (four rows at a time) and is vectorized through the
T<TN> vectors. Per panel of TK inner indices (GotoBLAS's KC) it gathers B (TK x TN) into local memory,
then runs four rows of A at a time past it, read in place, with their four accumulators in registers
for the whole panel: one load and store of the accumulators per panel, not per 16 inner indices.

The file calls no OpenCL built-in function that takes or returns a vector (vloadN, vstoreN, fma) and
no min: netcl.runtime.cl_vectors says why (the PoCL wheel's LLVM 14 aborted on this kernel's float16 fma).
</%doc>
<%! from netcl.runtime.cl_vectors import vload, vstore, lesser %>
<%! from netcl.runtime.cl_activation import apply_activation %>
<%page args="T='float', MODE='forward', TM=64, TN=16, TK=512, BIAS=False, RESIDUAL=False, ACT='none'"/>
<%
    VT = T + str(TN)
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#define FAR (-(1 << 29))

__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void igemm_${MODE}(
    __global const ${T}* A, const long a_off,
    __global const ${T}* B, const long b_off,
    __global ${T}* Cout, const long c_off,
    __constant const long* geom,
    __global const ${T}* bias, const long bias_off,
    __global const ${T}* residual, const long residual_off)
{
    const int N = geom[0], C = geom[1], H = geom[2], W = geom[3], K = geom[4], R = geom[5], S = geom[6];
    const int P = geom[7], Q = geom[8], SH = geom[9], SW = geom[10], PH = geom[11], PW = geom[12];
    const int DH = geom[13], DW = geom[14], G = geom[15];
    const int CG = C / G, KG = K / G, RS = R * S, HW = H * W, PQ = P * Q;
% if MODE != 'backward_data':
    const int g = get_group_id(2);
% endif
% if MODE == 'forward':
    const int MD = KG, ND = N * PQ, KD = CG * RS;
    const int LIM_H = H, LIM_W = W;
    const long a_base = a_off + (long)g * KG * KD, a_m = KD;
    const int s_m = PQ;
% elif MODE == 'backward_data':
    // residue class of this launch slice and its valid taps r = r0 + t*sr (t < RV), s = s0 + t*ss (t < SV)
    const int cls = get_group_id(2) % (SH * SW), g = get_group_id(2) / (SH * SW);
    const int ca = cls / SW, cb = cls - ca * SW;
    const int HC = ca < H ? (H - ca + SH - 1) / SH : 0, WC = cb < W ? (W - cb + SW - 1) / SW : 0;
    int r0 = 0, s0 = 0;
    while (r0 < R && ((ca + PH - r0 * DH) % SH + SH) % SH != 0) ++r0;
    while (s0 < S && ((cb + PW - s0 * DW) % SW + SW) % SW != 0) ++s0;
    int sr = SH, ss = SW;
    for (int d = DH, e = SH; ; ) { const int t = d % e; if (t == 0) { sr = SH / e; break; } d = e; e = t; }
    for (int d = DW, e = SW; ; ) { const int t = d % e; if (t == 0) { ss = SW / e; break; } d = e; e = t; }
    const int RV = r0 < R ? (R - 1 - r0) / sr + 1 : 0, SV = s0 < S ? (S - 1 - s0) / ss + 1 : 0;
    const int MD = CG, ND = N * HC * WC, KD = KG * RV * SV;
    const int LIM_H = P, LIM_W = Q;
    const long a_base = a_off + (long)g * KG * CG * RS, a_m = RS;
    const int s_m = HW;
% else:
    const int MD = KG, ND = CG * RS, KD = N * PQ;
    const int LIM_H = H, LIM_W = W;
    const long a_base = a_off + (long)g * KG * PQ, a_m = PQ;
    const int s_m = CG * RS;
% endif
    const int m0 = get_group_id(1) * ${TM}, n0 = get_group_id(0) * ${TN};
    const int rows = ${lesser(str(TM), '(MD - m0)')};

    __local ${T} Bs[${TK}][${TN}];
    int col_off[${TN}], col_h[${TN}], col_w[${TN}], col_store[${TN}];
    int in_off[${TK}], in_h[${TK}], in_w[${TK}], in_a[${TK}];

    // Column tables, decomposed once.
    for (int j = 0; j < ${TN}; ++j) {
        const int col = n0 + j;
        int off = 0, hh = FAR, ww = FAR, st = -1;
        if (col < ND) {
% if MODE == 'forward':
            const int n = col / PQ, pq = col - n * PQ, p = pq / Q, q = pq - p * Q;
            hh = p * SH - PH; ww = q * SW - PW;
            off = (n * C + g * CG) * HW + hh * W + ww;
            st = (n * K + g * KG) * PQ + pq;
% elif MODE == 'backward_data':
            const int n = col / (HC * WC), hw = col - n * HC * WC, h = hw / WC, w = hw - h * WC;
            hh = h; ww = w;
            off = (n * K + g * KG) * PQ + h * Q + w;
            st = (n * C + g * CG) * HW + (h * SH + ca) * W + w * SW + cb;
% else:
            const int c = col / RS, rs = col - c * RS, r = rs / S, s = rs - r * S;
            hh = r * DH; ww = s * DW;
            off = (g * CG + c) * HW + hh * W + ww;
            st = (g * KG) * CG * RS + col;
% endif
        }
        col_off[j] = off; col_h[j] = hh; col_w[j] = ww; col_store[j] = st;
    }

    // Do the TN columns read TN consecutive source elements along one source row (for every inner
    // index)? Then each gather is one vector load unless a border cuts the run.
% if MODE == 'backward_weight':
    const int run = 0;
% else:
    int run = 1;
    for (int b = 1; b < ${TN}; ++b)
        run = run && col_h[b] == col_h[0] && col_w[b] == col_w[0] + b && col_off[b] == col_off[0] + b;
% endif

    ${VT} acc[${TM}];
    for (int m = 0; m < ${TM}; ++m) acc[m] = (${VT})(0);

    // The inner index advances without divisions: (u0, u1, u2) = (c, r, s) for forward,
    // (k, r, s) for backward_data (r, s counted among the class's valid taps), (n, p, q) for backward_weight.
    int u0 = 0, u1 = 0, u2 = 0;
    for (int k0 = 0; k0 < KD; k0 += ${TK}) {
        const int kc = ${lesser(str(TK), '(KD - k0)')};
        for (int i = 0; i < kc; ++i) {
            int off, hh, ww, ao;
% if MODE == 'forward':
            hh = u1 * DH; ww = u2 * DW;
            off = u0 * HW + hh * W + ww;
            ao = k0 + i;
            if (++u2 == S) { u2 = 0; if (++u1 == R) { u1 = 0; ++u0; } }
% elif MODE == 'backward_data':
            const int r = r0 + u1 * sr, s = s0 + u2 * ss;
            hh = (ca + PH - r * DH) / SH; ww = (cb + PW - s * DW) / SW;  // exact divisions
            off = u0 * PQ + hh * Q + ww;
            ao = u0 * CG * RS + r * S + s;
            if (++u2 == SV) { u2 = 0; if (++u1 == RV) { u1 = 0; ++u0; } }
% else:
            hh = u1 * SH - PH; ww = u2 * SW - PW;
            off = u0 * C * HW + hh * W + ww;
            ao = u0 * K * PQ + u1 * Q + u2;
            if (++u2 == Q) { u2 = 0; if (++u1 == P) { u1 = 0; ++u0; } }
% endif
            in_off[i] = off; in_h[i] = hh; in_w[i] = ww; in_a[i] = ao;
        }

        // B panel (kc x TN), gathered straight from the source tensor.
        for (int i = 0; i < kc; ++i) {
            const int ih = in_h[i], iw = in_w[i], io = in_off[i];
% if MODE != 'backward_weight':
            const int hh0 = col_h[0] + ih, ww0 = col_w[0] + iw;
            if (run && (uint)hh0 < (uint)LIM_H && ww0 >= 0 && ww0 + ${TN - 1} < LIM_W) {
                const ${VT} run_vals = ${vload(VT, TN, 'B + b_off + col_off[0] + io')};
                ${vstore('run_vals', TN, '&Bs[i][0]')}
                continue;
            }
% endif
            for (int j = 0; j < ${TN}; ++j) {
                const int hh = col_h[j] + ih, ww = col_w[j] + iw;
                const int ok = (uint)hh < (uint)LIM_H && (uint)ww < (uint)LIM_W;
                const int idx = ok ? col_off[j] + io : 0;
                const ${T} v = B[b_off + idx];
                Bs[i][j] = ok ? v : (${T})0;
            }
        }

        // A read in place, four rows at a time, their accumulators in registers over the whole panel;
        // rows past the problem read the last real row and are never stored.
% if MODE == 'forward':
        const int a_run = 1;  // the panel's A elements are consecutive in every row
% else:
        const int a_run = in_a[kc - 1] - in_a[0] == kc - 1;
% endif
        for (int m = 0; m < rows; m += 4) {
            __global const ${T}* a0 = A + a_base + (long)(m0 + m) * a_m;
            __global const ${T}* a1 = A + a_base + (long)(m0 + ${lesser('(m + 1)', '(rows - 1)')}) * a_m;
            __global const ${T}* a2 = A + a_base + (long)(m0 + ${lesser('(m + 2)', '(rows - 1)')}) * a_m;
            __global const ${T}* a3 = A + a_base + (long)(m0 + ${lesser('(m + 3)', '(rows - 1)')}) * a_m;
            ${VT} r0 = acc[m], r1 = acc[m + 1], r2 = acc[m + 2], r3 = acc[m + 3];
            if (a_run) {
                const int first = in_a[0];
                a0 += first; a1 += first; a2 += first; a3 += first;
                for (int i = 0; i < kc; ++i) {
                    const ${VT} bv = ${vload(VT, TN, '&Bs[i][0]')};
                    r0 = (${VT})(a0[i]) * bv + r0;
                    r1 = (${VT})(a1[i]) * bv + r1;
                    r2 = (${VT})(a2[i]) * bv + r2;
                    r3 = (${VT})(a3[i]) * bv + r3;
                }
            } else {
                for (int i = 0; i < kc; ++i) {
                    const ${VT} bv = ${vload(VT, TN, '&Bs[i][0]')};
                    const int ao = in_a[i];
                    r0 = (${VT})(a0[ao]) * bv + r0;
                    r1 = (${VT})(a1[ao]) * bv + r1;
                    r2 = (${VT})(a2[ao]) * bv + r2;
                    r3 = (${VT})(a3[ao]) * bv + r3;
                }
            }
            acc[m] = r0; acc[m + 1] = r1; acc[m + 2] = r2; acc[m + 3] = r3;
        }
    }

    for (int m = 0; m < rows; ++m) {
        ${T} vals[${TN}];
% if MODE == 'forward' and (BIAS or RESIDUAL or ACT != 'none'):
% if BIAS:
        ${VT} out = acc[m] + (${VT})(bias[bias_off + g * KG + m0 + m]);
% else:
        ${VT} out = acc[m];
% endif
% if RESIDUAL:
        for (int b = 0; b < ${TN}; ++b) {
            const int st = col_store[b];   /* a column past the problem reads element 0, never stored */
            const ${T} r = residual[residual_off + (st >= 0 ? st + (m0 + m) * s_m : 0)];
            vals[b] = st >= 0 ? r : (${T})0;
        }
        out += ${vload(VT, TN, 'vals')};
% endif
        ${apply_activation(ACT, "out", VT)}
        ${vstore('out', TN, 'vals')}
% else:
        ${vstore('acc[m]', TN, 'vals')}
% endif
        for (int b = 0; b < ${TN}; ++b) {
            const int st = col_store[b];
            if (st >= 0) Cout[c_off + st + (m0 + m) * s_m] = vals[b];
        }
    }
}
