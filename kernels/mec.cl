<%doc>
MEC (Cho & Brand, "Memory-efficient Convolution", Algorithm 2) data movement; the products themselves
are batched GEMMs run by netcl.ops.gemm on shifted partitions of the compact lowering L.

The compact lowering, NHWC inside (netcl's NCHW is converted here, at the boundary), one block per group:

  L[n][q][g][h][s][c] = x[n, g*CG + c, h - PH, q*SW - PW + s*DW]     (zero outside x)
  n < N, q < Q (output width), h < IH = H + 2*PH (padded input height), s < S (kernel width), c < CG

Row (n, q) of L, read as an (N*Q) x (IH*S*C) matrix, holds the IH x S window columns of every channel;
the partition of output row p and group g starts at column g*IH*S*CG + p*SH*S*CG and spans R*S*CG
columns with leading dimension IH*S*C.

  mec_lower         x -> L, through local memory (see the kernel)
  mec_scatter       grad_L -> grad_x: grad_x[n,c,h,w] = sum over the (q, s) with q*SW - PW + s*DW = w of
                    grad_L[n][q][g][h + PH][s][c]  (the MEC analogue of col2im, written as a gather:
                    one work-item per grad_x element, no atomics)
  mec_weight_sum    backward_weight's partial gradients -> grad_w: grad_w[k][c][rs] = sum over the
                    `parts` partials j of gW2[j][k][rs*CG + c] (the sum over output rows and the
                    transpose back to (K, CG, R, S) in one pass)
The other filter layouts (forward's (R*S*CG) x K, backward_data's K x (R*S*CG)) are transposes, made
by netcl.ops.transpose.

`geom` is an int64 array [N, C, H, W, K, R, S, P, Q, SH, SW, PH, PW, DH, DW, G] (P, Q = output size).

Template parameters (all have defaults):
  T       element type, "float" or "double"                          (default "float")
  LOCAL   mec_lower's work-group size                                (default 64)
  CT      mec_lower's channel chunk: CT input rows sit in local memory (default 1)
  N C H W G Q S SW PW DW PH   mec_lower's geometry, compiled in (N, C, H, W input, G groups, Q output
          width, S kernel width, stride/padding/dilation along the width, PH padding along the height)
          (defaults 1 1 1 1 1 1 1 1 0 1 0)

Launch: mec_lower is 3-D, global (LOCAL, IH, N*G), local (LOCAL, 1, 1): one work-group per padded input
row and (sample, group). The others take `geom` at run time: one work-item per produced element (tails
guarded), 1-D, any local size.

No OpenCL built-in function takes or returns a vector here (vload8/vstore8 are spelled out) and min is
a comparison: netcl.runtime.cl_vectors says why (the PoCL wheel crashed running this file's double8 loads).
</%doc>
<%page args="T='float', LOCAL=64, CT=1, N=1, C=1, H=1, W=1, G=1, Q=1, S=1, SW=1, PW=0, DW=1, PH=0"/>
<%!
    from netcl.runtime.cl_vectors import vload, vstore, lesser
    from netcl.runtime.cl_guards import beyond
%>
<% CG = C // G; IH = H + 2 * PH %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#define GEOMETRY \
    const long N = geom[0], C = geom[1], H = geom[2], W = geom[3], K = geom[4], R = geom[5], S = geom[6]; \
    const long P = geom[7], Q = geom[8], SH = geom[9], SW = geom[10], PH = geom[11], PW = geom[12]; \
    const long DW = geom[14], G = geom[15]; \
    const long CG = C / G, KG = K / G, IH = H + 2 * PH;

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void mec_lower(
    __global const ${T}* restrict x, const long x_off,
    __global ${T}* restrict L, const long l_off)
{
    /* One work-group per (padded input row h, sample n, group g). Channel chunk by chunk, the CT input
       rows x[n, g*CG + c0 .. +CT, h - PH, :] are read along the row and stored channel-fastest in local
       memory (slab[w][c]: the NHWC transpose happens there, on the smaller side), then every output
       column q copies its runs out of the slab: S*CG contiguous elements when the whole channel range
       fits one chunk and the window is dense (DW = 1), else one run of the chunk per tap s. */
    __local ${T} slab[${CT * W}];
    const int lid = get_local_id(0);
    const int h = get_group_id(1), ng = get_group_id(2);
    const int n = ng / ${G}, g = ng - n * ${G};
    const int hh = h - ${PH};
    const bool row_inside = hh >= 0 && hh < ${H};
    __global const ${T}* plane0 = x + x_off + ((long)(n * ${C} + g * ${CG}) * ${H} + (row_inside ? hh : 0)) * ${W};
    __global ${T}* row0 = L + l_off + ((long)(n * ${Q} * ${G} + g) * ${IH} + h) * ${S * CG};
    for (int c0 = 0; c0 < ${CG}; c0 += ${CT}) {
        const int chunk = ${lesser(str(CT), '(%d - c0)' % CG)};
        barrier(CLK_LOCAL_MEM_FENCE);
        // a work-item per (channel, 8 columns), channels fastest: neighbouring work-items store
        // neighbouring slab elements, and the 8 unrolled loads of each stay within its input row
        for (int u = lid; u < ${CT * ((W + 7) // 8)}; u += ${LOCAL}) {
            const int wb = u / ${CT}, ct = u - wb * ${CT};
            const bool live = row_inside && ct < chunk;
            __global const ${T}* in = plane0 + (long)(c0 + (live ? ct : 0)) * ${H * W};
            #pragma unroll
            for (int v = 0; v < 8; ++v) {
                const int w = wb * 8 + v;
                if (w < ${W}) slab[w * ${CT} + ct] = live ? in[w] : (${T})0;
            }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
% if CT == CG and DW == 1:
        for (int q = lid; q < ${Q}; q += ${LOCAL}) {
            __global ${T}* dst = row0 + (long)q * ${G * IH * S * CG};
            const int start = (q * ${SW} - ${PW}) * ${CT};
            int j = 0;
            // explicit vectors: left to itself the compiler vectorizes across q, scattering the stores
            for (; j + 8 <= ${S * CT}; j += 8) {
                const int i = start + j;
                if (i >= 0 && i + 8 <= ${W * CT}) {
                    const ${T}8 run = ${vload(T + '8', 8, 'slab + i')};
                    ${vstore('run', 8, 'dst + j')}
                } else {
                    for (int v = 0; v < 8; ++v)
                        dst[j + v] = (i + v >= 0 && i + v < ${W * CT}) ? slab[i + v] : (${T})0;
                }
            }
            for (; j < ${S * CT}; ++j) {
                const int i = start + j;
                dst[j] = (i >= 0 && i < ${W * CT}) ? slab[i] : (${T})0;
            }
        }
% else:
        for (int u = lid; u < ${Q * S}; u += ${LOCAL}) {
            const int q = u / ${S}, s = u - q * ${S};
            const int ww = q * ${SW} - ${PW} + s * ${DW};
            __global ${T}* dst = row0 + (long)q * ${G * IH * S * CG} + s * ${CG} + c0;
            if (ww >= 0 && ww < ${W}) {
                int ct = 0;
                for (; ct + 8 <= chunk; ct += 8) {
                    const ${T}8 run = ${vload(T + '8', 8, 'slab + ww * %d + ct' % CT)};
                    ${vstore('run', 8, 'dst + ct')}
                }
                for (; ct < chunk; ++ct) dst[ct] = slab[ww * ${CT} + ct];
            } else {
                for (int ct = 0; ct < chunk; ++ct) dst[ct] = (${T})0;
            }
        }
% endif
    }
}

__kernel void mec_scatter(
    __global const ${T}* gL, const long gl_off,
    __global ${T}* gx, const long gx_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (${beyond('i', 'N * C * H * W')}) return;
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

__kernel void mec_weight_sum(
    __global const ${T}* partials, const long partials_off,
    __global ${T}* gw, const long gw_off,
    const long parts,
    __constant const long* geom)
{
    GEOMETRY
    const long RS = R * S, width = RS * CG;
    const long i = get_global_id(0);
    if (${beyond('i', 'K * width')}) return;
    // i runs along a partial's (k, rs, c) layout: the parts reads of neighbouring work-items are
    // contiguous, and only the single write per work-item is strided
    const long k = i / width, j = i - k * width, rs = j / CG, c = j - rs * CG;
    __global const ${T}* src = partials + partials_off + i;
    ${T} acc = 0;
    for (long part = 0; part < parts; ++part) acc += src[part * K * width];
    gw[gw_off + (k * CG + c) * RS + rs] = acc;
}
