<%doc>
col2im: fold a column matrix (see kernels/im2col.cl for both layouts) back into an NCHW tensor,
adding every column entry into the input element it was read from:
  gx[n, c, h, w] = sum of cols[(n,p,q), (c,r,s)] over all (p, q, r, s) with
                   h = p*SH - PH + r*DH and w = q*SW - PW + s*DW.

col2im_scatter  the im2col indexing run backwards: one work-item per column entry (VEC of them, spaced
                one work-group apart, as im2col), each adding its value into gx with an atomic add.
                float: compare-and-swap on the 32-bit pattern (OpenCL 1.2 has no float atomics);
                double: 64-bit compare-and-swap (needs cl_khr_int64_base_atomics; without it the
                caller uses the gather form). gx must be zeroed first. The summation order depends
                on scheduling, so the result may differ in the last bits from run to run.
col2im_gather   deterministic: one work-item per input element, summing the (at most R*S) entries that
                read it in a fixed order. Tap r of output row p reads row h iff (h + PH - r*DH) is a
                non-negative multiple of SH below P*SH; the same for columns. With unit dilation the
                loop steps over the taps SH apart that satisfy it.

Template parameters (all have defaults): T, IDX, TRANSPOSED, VEC, LOCAL and the geometry
N C H W R S P Q SH SW PH PW DH DW, exactly as in kernels/im2col.cl.

Launch: col2im_scatter: 1-D, global = ceil(N*P*Q*C*R*S / (LOCAL*VEC)) * LOCAL, local = LOCAL.
        col2im_gather: 1-D over N*C*H*W, any local size.
</%doc>
<%page args="T='float', IDX='long', TRANSPOSED=1, VEC=4, LOCAL=64, N=1, C=1, H=1, W=1, R=1, S=1, P=1, Q=1, SH=1, SW=1, PH=0, PW=0, DH=1, DW=1"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
% endif

#define RS   ((${IDX})${R * S})
#define CRS  ((${IDX})${C * R * S})
#define PQ   ((${IDX})${P * Q})
#define NPQ  ((${IDX})${N * P * Q})
#define TOTAL ((${IDX})${N * P * Q * C * R * S})

% if T == 'double':
inline void atomic_add_T(volatile __global double* p, const double v)
{
    union { ulong u; double f; } seen, want;
    seen.u = 0;   /* a guess, not a plain read (that would race): the first CAS returns the true value */
    for (;;) {
        want.f = seen.f + v;
        const ulong prev = atom_cmpxchg((volatile __global ulong*)p, seen.u, want.u);
        if (prev == seen.u) return;
        seen.u = prev;
    }
}
% else:
inline void atomic_add_T(volatile __global float* p, const float v)
{
    union { uint u; float f; } seen, want;
    seen.u = 0u;  /* a guess, not a plain read (that would race): the first CAS returns the true value */
    for (;;) {
        want.f = seen.f + v;
        const uint prev = atomic_cmpxchg((volatile __global uint*)p, seen.u, want.u);
        if (prev == seen.u) return;
        seen.u = prev;
    }
}
% endif

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void col2im_scatter(__global const ${T}* cols, const long cols_off, __global ${T}* gx, const long gx_off)
{
    const ${IDX} base = (${IDX})get_group_id(0) * ${LOCAL * VEC} + (${IDX})get_local_id(0);
    cols += cols_off;
    gx += gx_off;
    for (int v = 0; v < ${VEC}; ++v) {
        const ${IDX} i = base + v * ${LOCAL};
        if (i >= TOTAL) return;
% if TRANSPOSED:
        const ${IDX} crs = i / NPQ, npq = i - crs * NPQ;
% else:
        const ${IDX} npq = i / CRS, crs = i - npq * CRS;
% endif
        const ${IDX} c = crs / RS, rs = crs - c * RS, r = rs / ${S}, s = rs - r * ${S};
        const ${IDX} n = npq / PQ, pq = npq - n * PQ, p = pq / ${Q}, q = pq - p * ${Q};
        const ${IDX} h = p * ${SH} - ${PH} + r * ${DH}, w = q * ${SW} - ${PW} + s * ${DW};
        if (h >= 0 && h < ${H} && w >= 0 && w < ${W})
            atomic_add_T(gx + ((n * ${C} + c) * ${H} + h) * ${W} + w, cols[i]);
    }
}

__kernel void col2im_gather(__global const ${T}* restrict cols, const long cols_off,
                            __global ${T}* restrict gx, const long gx_off)
{
    const ${IDX} j = get_global_id(0);
    if (${beyond('j', '(%s)%d' % (IDX, N * C * H * W))}) return;
    const ${IDX} w = j % ${W}, h = (j / ${W}) % ${H}, c = (j / ${H * W}) % ${C}, n = j / ${C * H * W};
    __global const ${T}* src = cols + cols_off;
    /* Taps r whose output row p = (h + PH - r*DH) / SH lies in [0, P): r_lo..r_hi in closed form; the
       same for s. */
    const ${IDX} hp = h + ${PH}, wq = w + ${PW};
    /* ?: rather than the min/max built-ins, which are calls where the driver cannot inline them
       (netcl.runtime.cl_vectors) and stop the work-item loop from vectorizing */
    const ${IDX} r_first = (hp - ${(P - 1) * SH} + ${DH - 1}) / ${DH}, r_last = hp / ${DH};
    const ${IDX} s_first = (wq - ${(Q - 1) * SW} + ${DW - 1}) / ${DW}, s_last = wq / ${DW};
    const ${IDX} r_lo = r_first > 0 ? r_first : 0, r_hi = r_last < ${R - 1} ? r_last : ${R - 1};
    const ${IDX} s_lo = s_first > 0 ? s_first : 0, s_hi = s_last < ${S - 1} ? s_last : ${S - 1};
    ${T} acc = 0;
    /* With unit dilation, the taps that reach an output row are every SH-th from the first r ≥ r_lo with
       r ≡ hp (mod SH): the loop visits only those (a stride-2 layer's loop a quarter as long), with no
       divisibility test; a dilated strided layer tests each tap. The same for columns. */
% if DH == 1:
    for (${IDX} r = r_lo + (hp - r_lo) % ${SH}; r <= r_hi; r += ${SH}) {
        const ${IDX} p = (hp - r) / ${SH};
% else:
    for (${IDX} r = r_lo; r <= r_hi; ++r) {
        const ${IDX} ph = hp - r * ${DH};
%   if SH > 1:
        if (ph % ${SH}) continue;
%   endif
        const ${IDX} p = ph / ${SH};
% endif
% if DW == 1:
        for (${IDX} s = s_lo + (wq - s_lo) % ${SW}; s <= s_hi; s += ${SW}) {
            const ${IDX} q = (wq - s) / ${SW};
% else:
        for (${IDX} s = s_lo; s <= s_hi; ++s) {
            const ${IDX} qw = wq - s * ${DW};
%   if SW > 1:
            if (qw % ${SW}) continue;
%   endif
            const ${IDX} q = qw / ${SW};
% endif
            const ${IDX} crs = (c * ${R} + r) * ${S} + s, npq = (n * ${P} + p) * ${Q} + q;
% if TRANSPOSED:
            acc += src[crs * NPQ + npq];
% else:
            acc += src[npq * CRS + crs];
% endif
        }
    }
    gx[gx_off + j] = acc;
}
