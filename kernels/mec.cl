<%doc>
MEC (Cho & Brand, "Memory-efficient Convolution", Algorithm 2) data movement; the products themselves
are batched GEMMs run by netcl.ops.gemm on shifted partitions of the compact lowering L.

The compact lowering, NHWC inside (netcl's NCHW is converted here, at the boundary), one block per group:

  L[n][q][g][h][s][c] = x[n, g*CG + c, h - PH, q*SW - PW + s*DW]     (zero outside x)
  n < N, q < Q (output width), h < IH = H + 2*PH (padded input height), s < S (kernel width), c < CG

Row (n, q) of L, read as an (N*Q) x (IH*S*C) matrix, holds the IH x S window columns of every channel;
the partition of output row p and group g starts at column g*IH*S*CG + p*SH*S*CG and spans R*S*CG
columns with leading dimension IH*S*C.

  mec_lower         x -> L
  mec_scatter       grad_L -> grad_x: grad_x[n,c,h,w] = sum over the (q, s) with q*SW - PW + s*DW = w of
                    grad_L[n][q][g][h + PH][s][c]  (the MEC analogue of col2im, written as a gather:
                    one work-item per grad_x element, no atomics)
  mec_pack_weight   w (K, CG, R, S) -> Wt, the paper's (R*S*CG) x K matrix: Wt[(r*S + s)*CG + c][k]
  mec_pack_weight_rows  w -> W2, its transpose K x (R*S*CG): W2[k][(r*S + s)*CG + c] (backward_data)
  mec_unpack_grad   gW2 (K x R*S*CG, row k = the k-th output channel) -> grad_w (K, CG, R, S)

`geom` is an int64 array [N, C, H, W, K, R, S, P, Q, SH, SW, PH, PW, DH, DW, G] (P, Q = output size).

Template parameters (all have defaults):
  T   element type, "float" or "double"   (default "float")

Launch: one work-item per produced element (tails guarded), any local size; mec_lower is 3-D
(CG, IH*S, N*Q*G), the others 1-D.
</%doc>
<%page args="T='float'"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#define GEOMETRY \
    const long N = geom[0], C = geom[1], H = geom[2], W = geom[3], K = geom[4], R = geom[5], S = geom[6]; \
    const long P = geom[7], Q = geom[8], SH = geom[9], SW = geom[10], PH = geom[11], PW = geom[12]; \
    const long DW = geom[14], G = geom[15]; \
    const long CG = C / G, KG = K / G, IH = H + 2 * PH;

__kernel void mec_lower(
    __global const ${T}* x, const long x_off,
    __global ${T}* L, const long l_off,
    __constant const long* geom)
{
    GEOMETRY
    // (c, h*S + s, (n*Q + q)*G + g): 32-bit index arithmetic, one small division per dimension
    const int c = get_global_id(0), hs = get_global_id(1), nqg = get_global_id(2);
    if (c >= CG || hs >= IH * S || nqg >= N * Q * G) return;
    const int h = hs / (int)S, s = hs - h * (int)S;
    const int nq = nqg / (int)G, g = nqg - nq * (int)G;
    const int n = nq / (int)Q, q = nq - n * (int)Q;
    const int hh = h - (int)PH, ww = q * (int)SW - (int)PW + s * (int)DW;
    L[l_off + ((long)nqg * IH * S + hs) * CG + c] = (hh >= 0 && hh < H && ww >= 0 && ww < W)
        ? x[x_off + (((long)n * C + g * CG + c) * H + hh) * W + ww] : (${T})0;
}

__kernel void mec_scatter(
    __global const ${T}* gL, const long gl_off,
    __global ${T}* gx, const long gx_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= N * C * H * W) return;
    const long w = i % W, h = (i / W) % H, cc = (i / (W * H)) % C, n = i / (W * H * C);
    const long g = cc / CG, c = cc - g * CG;
    const long wp = w + PW;
    __global const ${T}* row = gL + gl_off + ((n * Q * G + g) * IH + h + PH) * S * CG + c;
    const long ld = G * IH * S * CG;
    ${T} acc = 0;
    for (long s = 0; s < S; ++s) {
        const long t = wp - s * DW;
        if (t < 0) break;
        const long q = t / SW;
        if (q * SW != t || q >= Q) continue;
        acc += row[q * ld + s * CG];
    }
    gx[gx_off + i] = acc;
}

__kernel void mec_pack_weight(
    __global const ${T}* w, const long w_off,
    __global ${T}* Wt, const long wt_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= R * S * CG * K) return;
    const long k = i % K, j = i / K;
    const long c = j % CG, rs = j / CG;
    Wt[wt_off + i] = w[w_off + (k * CG + c) * R * S + rs];
}

__kernel void mec_pack_weight_rows(
    __global const ${T}* w, const long w_off,
    __global ${T}* W2, const long w2_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= K * R * S * CG) return;
    const long j = i % (R * S * CG), k = i / (R * S * CG);
    const long c = j % CG, rs = j / CG;
    W2[w2_off + i] = w[w_off + (k * CG + c) * R * S + rs];
}

__kernel void mec_unpack_grad(
    __global const ${T}* gW2, const long g_off,
    __global ${T}* gw, const long gw_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (i >= K * CG * R * S) return;
    const long rs = i % (R * S), c = (i / (R * S)) % CG, k = i / (R * S * CG);
    gw[gw_off + i] = gW2[g_off + k * R * S * CG + rs * CG + c];
}
