<%doc>
Batched, strided 2-D transpose through local memory. For b < NB, r < NR, c < NC:

  dst[dst_off + b*DB + (r / RLO)*DRH + r % RLO + (c / CLO)*DCH + (c % CLO)*DCL] = src[src_off + b*SB + r*SR + c]

FORM="local" (GPUs): src is read along its contiguous columns c and dst written along its contiguous
rows r, a TILE x TILE block at a time through local memory, so neither side is touched with a stride.
FORM="direct" (CPUs, where a local-memory tile costs a barrier loop and ran at 1.6-3 GB/s on PoCL): each
work-item moves TILE consecutive columns of one row; the compiler vectorizes across work-items, so the
stores are contiguous vectors and the loads gather from rows that stay in cache (19.6 GB/s, TILE = 8). Splitting r and c lets one launch reorder
three or four axes, e.g. MEC's output O[p][n][q][k] -> y[n][k][p][q] (r = n*Q + q, c = k, b = p) and
its filter w[k][c][rs] -> Wt[rs][c][k] (r = k, c = c*RS + rs). netcl.ops.transpose launches it.

Template parameters (all have defaults):
  T      element type, "float" or "double"           (default "float")
  FORM   "local" or "direct" (above)                 (default "local")
  TILE   block edge ("local"), columns per work-item ("direct")        (default 32)
  ROWS   "local": work-items along dimension 1 (TILE / ROWS block rows each; must divide TILE) (default 8)

Launch: "local": 3-D, global (ceil(NC / TILE) * TILE, ceil(NR / TILE) * ROWS, NB), local (TILE, ROWS, 1);
"direct": 3-D, global (NR, ceil(NC / TILE), NB), any local size. Partial blocks are guarded.
</%doc>
<%page args="T='float', FORM='local', TILE=32, ROWS=8"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

% if FORM == "local":
__kernel __attribute__((reqd_work_group_size(${TILE}, ${ROWS}, 1)))
void transpose_tiles(__global const ${T}* restrict src, const long src_off,
                     __global ${T}* restrict dst, const long dst_off,
                     const int NR, const int NC, const long SR, const long SB, const long DB,
                     const int RLO, const long DRH, const int CLO, const long DCH, const long DCL)
{
    __local ${T} tile[${TILE}][${TILE + 1}];
    const int lx = get_local_id(0), ly = get_local_id(1);
    const int c0 = get_group_id(0) * ${TILE}, r0 = get_group_id(1) * ${TILE};
    const long b = get_group_id(2);
    src += src_off + b * SB;
    for (int i = ly; i < ${TILE}; i += ${ROWS}) {
        const int r = r0 + i, c = c0 + lx;
        if (r < NR && c < NC) tile[i][lx] = src[r * SR + c];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    const int r = r0 + lx, r_hi = r / RLO;
    __global ${T}* out = dst + dst_off + b * DB + r_hi * DRH + (r - r_hi * RLO);
    for (int i = ly; i < ${TILE}; i += ${ROWS}) {
        const int c = c0 + i, c_hi = c / CLO;
        if (r < NR && c < NC) out[c_hi * DCH + (c - c_hi * CLO) * DCL] = tile[lx][i];
    }
}
% else:
__kernel void transpose_tiles(__global const ${T}* restrict src, const long src_off,
                              __global ${T}* restrict dst, const long dst_off,
                              const int NR, const int NC, const long SR, const long SB, const long DB,
                              const int RLO, const long DRH, const int CLO, const long DCH, const long DCL)
{
    /* one row r and TILE consecutive columns per work-item, the column loop unrolled: the device
       vectorizes across neighbouring work-items (consecutive r), so stores are contiguous vectors and
       loads gather from TILE-long runs of rows that stay in cache between iterations */
    const int r = get_global_id(0), c0 = get_global_id(1) * ${TILE};
    if (${beyond('r', 'NR')}) return;
    const long b = get_global_id(2);
    const int r_hi = r / RLO;
    __global const ${T}* in = src + src_off + b * SB + r * SR;
    __global ${T}* out = dst + dst_off + b * DB + r_hi * DRH + (r - r_hi * RLO);
    const int c_hi = c0 / CLO;
    int c_lo = c0 - c_hi * CLO;
    long at = c_hi * DCH + c_lo * DCL;  // stepped along c: +DCL, and at the end of a split +DCH - CLO*DCL
    const long wrap = DCH - CLO * DCL;
    if (c0 + ${TILE} <= NC) {
        #pragma unroll
        for (int j = 0; j < ${TILE}; ++j) {
            out[at] = in[c0 + j];
            at += DCL;
            if (++c_lo == CLO) { c_lo = 0; at += wrap; }
        }
    } else {
        for (int c = c0; c < NC; ++c) {
            out[at] = in[c];
            at += DCL;
            if (++c_lo == CLO) { c_lo = 0; at += wrap; }
        }
    }
}
% endif
