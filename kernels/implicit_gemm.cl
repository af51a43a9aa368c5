<%doc>
Implicit-GEMM convolution (NCHW input, KCRS weight, grouped): one tiled GEMM per pass whose B tiles are
gathered straight from the input (or output-gradient) tensor into local memory. No lowered matrix
exists anywhere: the only extra memory is the work-group's local tiles and index tables.

Every pass is C[m, j] = sum_i A[m, i] * B[i, j] over one group (get_group_id(2) = group index):

  MODE            rows m        columns j         inner i          A            B (gathered)
  forward         k  (K/G)      (n, p, q)         (c, r, s)        weight       x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]
  backward_data   c  (C/G)      (n, h, w)         (k, r, s)        weight       gy[n, k, (h+PH-r*DH)/SH, (w+PW-s*DW)/SW]
  backward_weight k  (K/G)      (c, r, s)         (n, p, q)        grad_y       x[n, c, p*SH-PH+r*DH, q*SW-PW+s*DW]

B's address splits into a column part and an inner part (offset, row, column), so each tile first
decomposes its TN columns and TK inner indices once into local tables; the gather itself then needs
only additions and a bounds test (plus, for strided backward_data, a divisibility test).

`geom` is an int64 array [N, C, H, W, K, R, S, P, Q, SH, SW, PH, PW, DH, DW, G] (P, Q = output size).

Template parameters (all have defaults):
  T      element type, "float" or "double"                      (default "float")
  MODE   "forward", "backward_data" or "backward_weight"        (default "forward")
  TM     rows of C per work-group tile                          (default 32)
  TN     columns of C per work-group tile                       (default 64)
  TK     inner-dimension slice loaded into local memory per step (default 16)
  WM     rows per work-item (TM % WM == 0)                      (default 4)
  WN     contiguous columns per work-item, held as one vector T<WN>: 2, 4, 8 or 16 (default 16)

Launch: global (ceil(cols/TN)*TN/WN, ceil(rows/TM)*TM/WM, G), local (TN/WN, TM/WM, 1).
A work-item owns rows ly*WM .. ly*WM+WM-1 and the WN contiguous columns lx*WN .., accumulated as WM
vectors of WN elements (explicit vectors: a CPU device runs one work-item per SIMD lane group, so the
arithmetic is vectorized inside the work-item rather than across work-items).
</%doc>
<%page args="T='float', MODE='forward', TM=32, TN=64, TK=16, WM=4, WN=16"/>
<%
    LX = TN // WN
    LY = TM // WM
    VT = T + str(WN)
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#define FAR (-(1 << 29))

__kernel __attribute__((reqd_work_group_size(${LX}, ${LY}, 1)))
void igemm_${MODE}(
    __global const ${T}* A, const long a_off,
    __global const ${T}* B, const long b_off,
    __global ${T}* Cout, const long c_off,
    __constant const long* geom)
{
    const int N = geom[0], C = geom[1], H = geom[2], W = geom[3], K = geom[4], R = geom[5], S = geom[6];
    const int P = geom[7], Q = geom[8], SH = geom[9], SW = geom[10], PH = geom[11], PW = geom[12];
    const int DH = geom[13], DW = geom[14], G = geom[15];
    const int CG = C / G, KG = K / G, RS = R * S, HW = H * W, PQ = P * Q;
    const int g = get_group_id(2);
% if MODE == 'forward':
    const int MD = KG, ND = N * PQ, KD = CG * RS;
    const int LIM_H = H, LIM_W = W;
    const long a_base = a_off + (long)g * KG * KD, a_m = KD;
    const int s_m = PQ;
% elif MODE == 'backward_data':
    const int MD = CG, ND = N * HW, KD = KG * RS;
    const int LIM_H = P, LIM_W = Q;
    const long a_base = a_off + (long)g * KG * CG * RS, a_m = RS;
    const int s_m = HW;
% else:
    const int MD = KG, ND = CG * RS, KD = N * PQ;
    const int LIM_H = H, LIM_W = W;
    const long a_base = a_off + (long)g * KG * PQ, a_m = PQ;
    const int s_m = CG * RS;
% endif

    const int lx = get_local_id(0), ly = get_local_id(1);
    const int lid = ly * ${LX} + lx;
    const int m0 = get_group_id(1) * ${TM}, n0 = get_group_id(0) * ${TN};

    __local ${T} As[${TK}][${TM}];
    __local ${T} Bs[${TK}][${TN}];
    __local int col_off[${TN}], col_h[${TN}], col_w[${TN}], col_store[${TN}];
    __local int in_off[${TK}], in_h[${TK}], in_w[${TK}], in_a[${TK}];

    // Column tables: decomposed once per tile.
    for (int j = lid; j < ${TN}; j += ${LX * LY}) {
        const int col = n0 + j;
        int off = 0, hh = FAR, ww = FAR, st = -1;
        if (col < ND) {
% if MODE == 'forward':
            const int n = col / PQ, pq = col - n * PQ, p = pq / Q, q = pq - p * Q;
            hh = p * SH - PH; ww = q * SW - PW;
            off = (n * C + g * CG) * HW + hh * W + ww;
            st = (n * K + g * KG) * PQ + pq;
% elif MODE == 'backward_data':
            const int n = col / HW, hw = col - n * HW, h = hw / W, w = hw - h * W;
            hh = h + PH; ww = w + PW;
            off = (n * K + g * KG) * PQ;
            st = (n * C + g * CG) * HW + hw;
% else:
            const int c = col / RS, rs = col - c * RS, r = rs / S, s = rs - r * S;
            hh = r * DH; ww = s * DW;
            off = (g * CG + c) * HW + hh * W + ww;
            st = (g * KG) * CG * RS + col;
% endif
        }
        col_off[j] = off; col_h[j] = hh; col_w[j] = ww; col_store[j] = st;
    }

% for a in range(WM):
    ${VT} acc${a} = (${VT})(0);
% endfor

    for (int k0 = 0; k0 < KD; k0 += ${TK}) {
        // Inner-index tables for this slice.
        for (int i = lid; i < ${TK}; i += ${LX * LY}) {
            const int kk = k0 + i;
            int off = 0, hh = FAR, ww = FAR, ao = -1;
            if (kk < KD) {
% if MODE == 'forward':
                const int c = kk / RS, rs = kk - c * RS, r = rs / S, s = rs - r * S;
                hh = r * DH; ww = s * DW;
                off = c * HW + hh * W + ww;
                ao = kk;
% elif MODE == 'backward_data':
                const int k = kk / RS, rs = kk - k * RS, r = rs / S, s = rs - r * S;
                hh = -r * DH; ww = -s * DW;
                off = k * PQ;
                ao = k * CG * RS + rs;
% else:
                const int n = kk / PQ, pq = kk - n * PQ, p = pq / Q, q = pq - p * Q;
                hh = p * SH - PH; ww = q * SW - PW;
                off = n * C * HW + hh * W + ww;
                ao = (n * K) * PQ + pq;
% endif
            }
            in_off[i] = off; in_h[i] = hh; in_w[i] = ww; in_a[i] = ao;
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        // Each work-item stages the rows i = ly, ly+LY, ... of the A and B slices; along the columns
        // it gathers the WN contiguous columns it will compute (a unit-stride loop the compiler can
        // vectorize), along the rows of A the slots lx, lx+LX, ...
        for (int i = ly; i < ${TK}; i += ${LY}) {
            const int ao = in_a[i];
            for (int m = lx; m < ${TM}; m += ${LX}) {
                const int row = m0 + m;
                As[i][m] = (ao >= 0 && row < MD) ? A[a_base + ao + row * a_m] : (${T})0;
            }
            const int ih = in_h[i], iw = in_w[i], io = in_off[i];
            for (int j = lx * ${WN}; j < lx * ${WN} + ${WN}; ++j) {
                const int hh = col_h[j] + ih, ww = col_w[j] + iw;
% if MODE == 'backward_data':
                // hh, ww are output-gradient coordinates times the stride
                int ok = hh >= 0 && ww >= 0;
                int p = hh, q = ww;
                if (SH != 1) { p = hh / SH; ok = ok && p * SH == hh; }
                if (SW != 1) { q = ww / SW; ok = ok && q * SW == ww; }
                ok = ok && p < LIM_H && q < LIM_W;
                Bs[i][j] = ok ? B[b_off + col_off[j] + io + p * Q + q] : (${T})0;
% else:
                const int ok = (uint)hh < (uint)LIM_H && (uint)ww < (uint)LIM_W;
                Bs[i][j] = ok ? B[b_off + col_off[j] + io] : (${T})0;
% endif
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);

        for (int i = 0; i < ${TK}; ++i) {
            const ${VT} bv = vload${WN}(0, &Bs[i][lx * ${WN}]);
% for a in range(WM):
            acc${a} = mad((${VT})(As[i][ly * ${WM} + ${a}]), bv, acc${a});
% endfor
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }

% for a in range(WM):
    {
        const int row = m0 + ly * ${WM} + ${a};
        if (row < MD) {
            ${T} vals[${WN}];
            vstore${WN}(acc${a}, 0, vals);
            for (int b = 0; b < ${WN}; ++b) {
                const int st = col_store[lx * ${WN} + b];
                if (st >= 0) Cout[c_off + st + row * s_m] = vals[b];
            }
        }
    }
% endfor
}
