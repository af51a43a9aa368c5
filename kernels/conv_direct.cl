<%doc>
Direct 2-D convolution (cross-correlation), NCHW input, KCRS weight, grouped: the reference strategy
that serves every layer. Three kernels, one work-item per element of the tensor each one produces,
so no kernel needs atomics and every result is deterministic.

  conv_direct_forward          y[n,k,p,q]  = sum_{c,r,s} x[n, g*CG+c, p*SH-PH+r*DH, q*SW-PW+s*DW] * w[k,c,r,s]
  conv_direct_backward_data    gx[n,c,h,w] = sum over the (k, r, s) whose window covers (h, w) of gy * w
  conv_direct_backward_weight  gw[k,c,r,s] = sum_{n,p,q} gy[n,k,p,q] * x[n, g*CG+c, ...]

Tensors are contiguous and passed as (buffer, element offset). `geom` is an int array:
  [N, C, H, W, K, R, S, P, Q, SH, SW, PH, PW, DH, DW, G]  (P, Q = output height, width; G = groups).

Template parameters (all have defaults):
  T   element type, "float" or "double"   (default "float")

Launch: 1-D, global size = number of produced elements (rounded up; tails are guarded), any local size.
</%doc>
<%page args="T='float'"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#define GEOMETRY \
    const long N = geom[0], C = geom[1], H = geom[2], W = geom[3], K = geom[4], R = geom[5], S = geom[6]; \
    const long P = geom[7], Q = geom[8], SH = geom[9], SW = geom[10], PH = geom[11], PW = geom[12]; \
    const long DH = geom[13], DW = geom[14], G = geom[15]; \
    const long CG = C / G, KG = K / G;

/* The taps t in [0, T) with 0 <= o + t*D < L, as [*lo, *hi): closed form, so the MAC loops carry no
   bounds tests. */
inline void tap_range(const long o, const long D, const long L, const long T, long* lo, long* hi)
{
    *lo = o >= 0 ? 0 : (-o + D - 1) / D;
    *hi = L - 1 - o < 0 ? 0 : min(T, (L - 1 - o) / D + 1);
    if (*hi < *lo) *hi = *lo;
}

__kernel void conv_direct_forward(
    __global const ${T}* x, const long x_off,
    __global const ${T}* w, const long w_off,
    __global ${T}* y, const long y_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (${beyond('i', 'N * K * P * Q')}) return;
    const long q = i % Q, p = (i / Q) % P, k = (i / (Q * P)) % K, n = i / (Q * P * K);
    const long g = k / KG;
    const long h0 = p * SH - PH, w0 = q * SW - PW;
    __global const ${T}* xn = x + x_off + (n * C + g * CG) * H * W;
    __global const ${T}* wk = w + w_off + k * CG * R * S;
    long r_lo, r_hi, s_lo, s_hi;
    tap_range(h0, DH, H, R, &r_lo, &r_hi);
    tap_range(w0, DW, W, S, &s_lo, &s_hi);
    ${T} acc = 0;
    for (long c = 0; c < CG; ++c) {
        for (long r = r_lo; r < r_hi; ++r) {
            __global const ${T}* xr = xn + (c * H + h0 + r * DH) * W;
            __global const ${T}* wr = wk + (c * R + r) * S;
            for (long s = s_lo; s < s_hi; ++s) acc += xr[w0 + s * DW] * wr[s];
        }
    }
    y[y_off + i] = acc;
}

__kernel void conv_direct_backward_data(
    __global const ${T}* gy, const long gy_off,
    __global const ${T}* w, const long w_off,
    __global ${T}* gx, const long gx_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (${beyond('i', 'N * C * H * W')}) return;
    const long ww = i % W, hh = (i / W) % H, c = (i / (W * H)) % C, n = i / (W * H * C);
    const long g = c / CG, cg = c % CG;
    ${T} acc = 0;
    for (long r = 0; r < R; ++r) {
        const long ph = hh + PH - r * DH;          /* = p * SH when tap r of output row p reads row hh */
        if (ph < 0) break;                         /* grows more negative with r */
        if (ph % SH) continue;
        const long p = ph / SH;
        if (p >= P) continue;
        for (long s = 0; s < S; ++s) {
            const long qw = ww + PW - s * DW;
            if (qw < 0) break;
            if (qw % SW) continue;
            const long q = qw / SW;
            if (q >= Q) continue;
            __global const ${T}* gyp = gy + gy_off + ((n * K + g * KG) * P + p) * Q + q;
            __global const ${T}* wp = w + w_off + ((g * KG * CG + cg) * R + r) * S + s;
            for (long k = 0; k < KG; ++k) acc += gyp[k * P * Q] * wp[k * CG * R * S];
        }
    }
    gx[gx_off + i] = acc;
}

__kernel void conv_direct_backward_weight(
    __global const ${T}* x, const long x_off,
    __global const ${T}* gy, const long gy_off,
    __global ${T}* gw, const long gw_off,
    __constant const long* geom)
{
    GEOMETRY
    const long i = get_global_id(0);
    if (${beyond('i', 'K * CG * R * S')}) return;
    const long s = i % S, r = (i / S) % R, c = (i / (S * R)) % CG, k = i / (S * R * CG);
    const long g = k / KG;
    /* output rows p whose tap r reads an input row: 0 <= p*SH + (r*DH - PH) < H */
    long p_lo, p_hi, q_lo, q_hi;
    tap_range(r * DH - PH, SH, H, P, &p_lo, &p_hi);
    tap_range(s * DW - PW, SW, W, Q, &q_lo, &q_hi);
    ${T} acc = 0;
    for (long n = 0; n < N; ++n) {
        __global const ${T}* xc = x + x_off + (n * C + g * CG + c) * H * W;
        __global const ${T}* gyk = gy + gy_off + (n * K + k) * P * Q;
        for (long p = p_lo; p < p_hi; ++p) {
            __global const ${T}* xr = xc + (p * SH - PH + r * DH) * W;
            __global const ${T}* gr = gyk + p * Q;
            for (long q = q_lo; q < q_hi; ++q) acc += gr[q] * xr[q * SW + s * DW - PW];
        }
    }
    gw[gw_off + i] = acc;
}
