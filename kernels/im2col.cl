<%doc>
im2col: lower an NCHW input to the column matrix of a convolution, in one flat pass.

Layouts (rows x columns, row-major, contiguous):
  TRANSPOSED=0  (N*P*Q, C*R*S): row (n, p, q) is one receptive field, column (c, r, s) one tap
  TRANSPOSED=1  (C*R*S, N*P*Q): the memo's layout, fed to W(K, CRS) x cols as the B operand
with  cols[(n,p,q), (c,r,s)] = x[n, c, p*SH - PH + r*DH, q*SW - PW + s*DW]   (0 outside the input).

im2col          the one-pass form (Zhang 2017, Alg. 2): the launch is flat over the output matrix and
                each work-item finds its (c, r, s, n, p, q) in closed form, with no loop over the
                kernel window. Two forms of "one work-item per small vector of entries":
                RUNS=0 (GPUs): VEC entries spaced one work-group apart (entry = group*LOCAL*VEC +
                  v*LOCAL + local id), each decoded in closed form, so neighbouring work-items touch
                  neighbouring entries (coalesced).
                RUNS=1 (CPUs): a run of consecutive entries; the first is decoded in closed form, then
                  TRANSPOSED=1: VEC whole output rows (Q entries each), each a zero fill, a strided
                  copy of one input row and a zero fill (vectorizable loops);
                  TRANSPOSED=0: VEC entries stepped one by one with carries, no division.
                CHUNKS=1 (CPUs, TRANSPOSED=1, no padding, Q >= L): the matrix is cut into chunks of L
                  entries (L = 32 bytes of T) aligned on the absolute address, so that each chunk is one
                  aligned vector store, streamed past the cache (non-temporal, where the compiler has
                  the builtin): the host picks this form for matrices larger than the last-level cache,
                  which the GEMM could not read back from it anyway. A work-item takes VEC consecutive chunks,
                  decodes the first in closed form and steps with carries; a chunk's taps are one
                  vector load from an input row (stride 1; a gather for larger strides), and where the
                  chunk straddles two output rows its last lanes are refilled from the next row. The entries before the first aligned address and after
                  the last whole chunk are copied one by one by work-item 0.
im2col_caffe    the Caffe-style form, only for `netcl bench im2col`: one work-item per (n, c, p, q) with
                two loops over the kernel window (writes the TRANSPOSED=1 layout only).
copy_bandwidth  dst[i] = src[i], VEC consecutive elements per work-item: the device's copy bandwidth,
                the roofline the benchmark reports against.

The geometry is compiled in (the divisions by R, S, P, Q... become multiplications), so one program
exists per layer shape; the disk cache keeps it.

Template parameters (all have defaults):
  T           element type, "float" or "double"                  (default "float")
  IDX         index type, "int" when every index fits, else "long" (default "long")
  TRANSPOSED  1 for the (CRS, NPQ) layout, 0 for (NPQ, CRS)        (default 1)
  RUNS        1: the run form, 0: the interleaved form             (default 0)
  VEC         entries per work-item (output rows of Q entries when RUNS=1 and TRANSPOSED=1,
              chunks of L entries when CHUNKS=1)                   (default 4)
  CHUNKS      1: the aligned-chunk form (takes precedence over RUNS) (default 0)
  LOCAL       the work-group size the kernel is launched with      (default 64)
  N C H W     input shape                                          (default 1 1 1 1)
  R S         kernel window                                        (default 1 1)
  P Q         output height and width                              (default 1 1)
  SH SW PH PW DH DW   stride, padding, dilation                    (default 1 1 0 0 1 1)

Launch: im2col: 1-D, global = ceil(units / (LOCAL*VEC)) * LOCAL, local = LOCAL, where units = C*R*S*N*P
        (output rows) for RUNS=1 TRANSPOSED=1, N*P*Q*C*R*S / L + 1 (chunks, at most one of them
        partial) for CHUNKS=1, else N*P*Q*C*R*S (entries).
        im2col_caffe: 1-D over N*C*P*Q, any local size.
        copy_bandwidth: 1-D over ceil(n / VEC), any local size.
</%doc>
<%page args="T='float', IDX='long', TRANSPOSED=1, RUNS=0, CHUNKS=0, VEC=4, LOCAL=64, N=1, C=1, H=1, W=1, R=1, S=1, P=1, Q=1, SH=1, SW=1, PH=0, PW=0, DH=1, DW=1"/>
<%!
    from netcl.runtime import cl_vectors
    from netcl.runtime.cl_guards import beyond
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

#if defined(__has_builtin)
#if __has_builtin(__builtin_nontemporal_store)
#define STREAM_STORE(value, at) __builtin_nontemporal_store(value, at)
#endif
#endif
#ifndef STREAM_STORE
#define STREAM_STORE(value, at) (*(at) = (value))
#endif

<%
def decode(i, transposed, qualifier, indent):
    """The closed-form decode of matrix entry `i` into (c, r, s, n, p, q) (and crs, npq, rs, pq):
    divisions by compile-time constants only. `qualifier` is "const " or "" (indices stepped later)."""
    split = (f"crs = {i} / NPQ, npq = {i} - crs * NPQ" if transposed else f"npq = {i} / CRS, crs = {i} - npq * CRS")
    pad = " " * indent
    return (f"const {IDX} {split};\n"
            f"{pad}{qualifier}{IDX} c = crs / RS, rs = crs - c * RS, r = rs / {S}, s = rs - r * {S};\n"
            f"{pad}{qualifier}{IDX} n = npq / PQ, pq = npq - n * PQ, p = pq / {Q}, q = pq - p * {Q};")
%>
#define RS   ((${IDX})${R * S})
#define CRS  ((${IDX})${C * R * S})
#define PQ   ((${IDX})${P * Q})
#define NPQ  ((${IDX})${N * P * Q})
#define TOTAL ((${IDX})${N * P * Q * C * R * S})

__kernel __attribute__((reqd_work_group_size(${LOCAL}, 1, 1)))
void im2col(__global const ${T}* restrict x, const long x_off, __global ${T}* restrict cols, const long cols_off)
{
    x += x_off;
    cols += cols_off;
% if CHUNKS:
<%
    L = 32 // (4 if T == 'float' else 8)
    TL = f"{T}{L}"
    # one strided vector load of L taps starting at `at`, and how many elements it touches
    # no vloadN, shuffle or select built-in (netcl.runtime.cl_vectors says why): element loads that LLVM
    # merges into vector loads, and for strides over 1 a gather
    if SW == 1:
        load, span = (lambda at: cl_vectors.vload(TL, L, at)), L
    else:
        load, span = (lambda at: f"({TL})(" + ", ".join(f"({at})[{i * SW}]" for i in range(L)) + ")"), (L - 1) * SW + 1
    # the last output row's vector load may run past the input: then a load near the end clamps each tap
    last_row = ((N - 1) * C + C - 1) * H * W + ((P - 1) * SH + (R - 1) * DH) * W + (S - 1) * DW
    guarded = last_row + (Q - 1) * SW + span > N * C * H * W
    def safe_load(at):
        if not guarded:
            return load(at)
        lanes = ", ".join(f"x[min((long)(({at}) - x) + {i * SW}, XLAST)]" for i in range(L))
        return f"(({at}) + {span} <= x + XLAST + 1 ? {load(at)} : ({TL})({lanes}))"
%>
#define XLAST ((long)${N * C * H * W - 1})
    const ${IDX} total = TOTAL;
    const ${IDX} lead = min(total, (${IDX})((${L} - cols_off % ${L}) % ${L}));
    const ${IDX} chunks = (total - lead) / ${L};
    const ${IDX} k0 = (${IDX})get_global_id(0) * ${VEC};
    if (k0 == 0) {
        /* the unaligned head and the partial tail, entry by entry */
        for (int part = 0; part < 2; ++part) {
            const ${IDX} lo = part ? lead + chunks * ${L} : 0, hi = part ? total : lead;
            for (${IDX} i = lo; i < hi; ++i) {
                ${decode("i", True, "const ", 16)}
                cols[i] = x[((n * ${C} + c) * ${H} + p * ${SH} + r * ${DH}) * ${W} + q * ${SW} + s * ${DW}];
            }
        }
    }
    if (k0 >= chunks) return;
    const ${IDX} k1 = min(k0 + ${VEC}, chunks);
    ${IDX} f = lead + k0 * ${L};
    ${decode("f", True, "", 4)}
    __global const ${T}* row = x + ((n * ${C} + c) * ${H} + p * ${SH} + r * ${DH}) * ${W} + s * ${DW};
    for (${IDX} k = k0; k < k1; ++k, f += ${L}) {
        ${TL} v = ${safe_load("row + q * " + str(SW))};
        q += ${L};
        if (q >= ${Q}) {
            /* the chunk ends in the next output row: its last q lanes are that row's first q taps */
            q -= ${Q};
            if (++p == ${P}) {
                p = 0;
                if (++n == ${N}) { n = 0; if (++s == ${S}) { s = 0; if (++r == ${R}) { r = 0; ++c; } } }
                row = x + ((n * ${C} + c) * ${H} + r * ${DH}) * ${W} + s * ${DW};
            } else {
                row += ${SH * W};
            }
            if (q) {
                /* lanes L - q ... L - 1 take the next row's first q taps (the row holds Q >= q of them) */
                ${T} lanes[${L}];
                ${cl_vectors.vstore("v", L, "lanes")}
                for (int k = ${L} - q; k < ${L}; ++k) lanes[k] = row[(k + q - ${L}) * ${SW}];
                v = ${cl_vectors.vload(TL, L, "lanes")};
            }
        }
        STREAM_STORE(v, (__global ${TL}*)(cols + f));
    }
% elif RUNS and TRANSPOSED:
<%
    Q_INSIDE = PW == 0 and (Q - 1) * SW + (S - 1) * DW <= W - 1
    P_INSIDE = PH == 0 and (P - 1) * SH + (R - 1) * DH <= H - 1
%>
    /* VEC consecutive output rows (c, r, s, n, p; q = 0..Q-1) of the matrix: decode the first in closed
       form, then step p -> n -> s -> r -> c. The columns q whose tap lies inside the input are one interval
       [lo, hi) that depends on s only, and a whole row is out when its h is: each row is a zero fill, a
       strided copy of one input row and a zero fill, with the checks the geometry rules out (no padding on
       that axis, every tap inside) left out at compile time, so the common copy is a loop of Q iterations. */
    const ${IDX} rows = ${C * R * S * N * P};
    const ${IDX} first = (${IDX})get_global_id(0) * ${VEC};
    if (first >= rows) return;
    const ${IDX} end = min(first + ${VEC}, rows);
    ${IDX} plane = first / ${P}, p = first - plane * ${P};
    const ${IDX} crs = plane / ${N};
    ${IDX} n = plane - crs * ${N};
    ${IDX} c = crs / RS, rs = crs - c * RS, r = rs / ${S}, s = rs - r * ${S};
    __global ${T}* out = cols + first * ${Q};
    for (${IDX} row = first; row < end;) {
        const ${IDX} w0 = s * ${DW} - ${PW};
% if Q_INSIDE:
        const ${IDX} lo = 0, hi = ${Q};
% else:
        const ${IDX} lo = w0 >= 0 ? 0 : min((${IDX})${Q}, (-w0 + ${SW - 1}) / ${SW});
        const ${IDX} hi = ${W - 1} - w0 < 0 ? lo : max(lo, min((${IDX})${Q}, (${W - 1} - w0) / ${SW} + 1));
% endif
        __global const ${T}* src = x + (n * ${C} + c) * ${H * W};
        const ${IDX} stop = min((${IDX})${P}, p + (end - row));
        row += stop - p;
        for (; p < stop; ++p, out += ${Q}) {
            const ${IDX} h = p * ${SH} - ${PH} + r * ${DH};
% if not P_INSIDE:
            if (h < 0 || h >= ${H}) {
                for (int q = 0; q < ${Q}; ++q) out[q] = (${T})0;
                continue;
            }
% endif
            const ${IDX} at = h * ${W} + w0;
% if not Q_INSIDE:
            for (${IDX} q = 0; q < lo; ++q) out[q] = (${T})0;
% endif
            for (${IDX} q = lo; q < hi; ++q) out[q] = src[at + q * ${SW}];
% if not Q_INSIDE:
            for (${IDX} q = hi; q < ${Q}; ++q) out[q] = (${T})0;
% endif
        }
        p = 0;
        if (++n == ${N}) { n = 0; if (++s == ${S}) { s = 0; if (++r == ${R}) { r = 0; ++c; } } }
    }
% elif RUNS:
    /* The row layout's run: entries (n, p, q, c, r, s) with s fastest. Decode the first in closed form,
       then step s -> r -> c -> q -> p -> n with carries (no division); consecutive s read consecutive
       input columns (DW apart), a new r the next input row, a new c the next plane. */
    ${IDX} i = (${IDX})get_global_id(0) * ${VEC};
    if (i >= TOTAL) return;
    const ${IDX} end = min(i + ${VEC}, TOTAL);
    ${decode("i", False, "", 4)}
    ${IDX} h = p * ${SH} - ${PH} + r * ${DH}, w = q * ${SW} - ${PW} + s * ${DW};
    ${IDX} plane = (n * ${C} + c) * ${H * W};
    for (; i < end; ++i) {
        cols[i] = (h >= 0 && h < ${H} && w >= 0 && w < ${W}) ? x[plane + h * ${W} + w] : (${T})0;
        w += ${DW};
        if (++s == ${S}) {
            s = 0; w = q * ${SW} - ${PW}; h += ${DH};
            if (++r == ${R}) {
                r = 0; h = p * ${SH} - ${PH}; plane += ${H * W};
                if (++c == ${C}) {
                    c = 0; plane -= ${C * H * W};
                    if (++q == ${Q}) {
                        q = 0;
                        if (++p == ${P}) { p = 0; plane += ${C * H * W}; }
                        h = p * ${SH} - ${PH};
                    }
                    w = q * ${SW} - ${PW};
                }
            }
        }
    }
% else:
    /* VEC entries spaced one work-group apart, each decoded in closed form (Alg. 2 of the paper). */
    const ${IDX} base = (${IDX})get_group_id(0) * ${LOCAL * VEC} + (${IDX})get_local_id(0);
    for (int v = 0; v < ${VEC}; ++v) {
        const ${IDX} i = base + v * ${LOCAL};
        if (i >= TOTAL) return;
        ${decode("i", TRANSPOSED, "const ", 8)}
        const ${IDX} h = p * ${SH} - ${PH} + r * ${DH}, w = q * ${SW} - ${PW} + s * ${DW};
        const bool inside = h >= 0 && h < ${H} && w >= 0 && w < ${W};
        cols[i] = inside ? x[((n * ${C} + c) * ${H} + h) * ${W} + w] : (${T})0;
    }
% endif
}

__kernel void im2col_caffe(__global const ${T}* restrict x, const long x_off, __global ${T}* restrict cols,
                           const long cols_off)
{
    const ${IDX} j = get_global_id(0);
    if (${beyond('j', '(%s)%d' % (IDX, N * C * P * Q))}) return;
    const ${IDX} q = j % ${Q}, p = (j / ${Q}) % ${P}, c = (j / PQ) % ${C}, n = j / (PQ * ${C});
    __global const ${T}* xc = x + x_off + (n * ${C} + c) * ${H * W};
    __global ${T}* out = cols + cols_off + c * RS * NPQ + n * PQ + p * ${Q} + q;
    const ${IDX} h0 = p * ${SH} - ${PH}, w0 = q * ${SW} - ${PW};
    for (int r = 0; r < ${R}; ++r) {
        const ${IDX} h = h0 + r * ${DH};
        for (int s = 0; s < ${S}; ++s) {
            const ${IDX} w = w0 + s * ${DW};
            *out = (h >= 0 && h < ${H} && w >= 0 && w < ${W}) ? xc[h * ${W} + w] : (${T})0;
            out += NPQ;
        }
    }
}

__kernel void copy_bandwidth(__global const ${T}* restrict src, __global ${T}* restrict dst, const long n)
{
    const long first = get_global_id(0) * ${VEC};
    const long end = min(first + ${VEC}, n);
    for (long i = first; i < end; ++i) dst[i] = src[i];
}
