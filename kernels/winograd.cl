<%doc>
Winograd F(2x2, 3x3) transforms (Lavin & Gray): every 2x2 output tile is A^T [ (G g G^T) (.) (B^T d B) ] A,
16 element-wise products per tile instead of 36 multiplies; the channel sums of those products are 16
batched GEMMs run by netcl.ops.gemm between the transforms below. The transforms themselves are stated once, in
kernels/_winograd_math.cl (shared with kernels/winograd_plane.cl); the backward-weight pair (A dy A^T,
G^T M G) is used only here. The transformed tensors are laid out
[16][channels][tiles] (filters [16][rows][cols]) so that each of the 16 GEMM operands is a contiguous
matrix, and a group g is simply a contiguous block of rows/columns inside it.

  wino_input_transform    V[e][c][t]   = (B^T d B)[e], d = the 4x4 patch of src at (2*ty - PAD_H, 2*tx - PAD_W)
                                         (zero outside the source; PAD may be negative); with TILE_MAJOR=1
                                         V[e][g][t][c - g*CH/GROUPS] instead (backward_weight's layout)
  wino_filter_transform   U[e][o][i]   = (G g G^T)[e]; FLIP=0: g = w[o][i] (forward, o = output channel,
                                         i = input channel of its group); FLIP=1: g = rot180(w[g*KG+i][o - g*CG])
                                         (backward data: o = input channel, i = output channel of its group)
  wino_filter_transform8 wino_filter_transform with FLIP=0 for eight consecutive input channels per
                         work-item (COLS a multiple of 8): their 72 filter taps are one contiguous run
  wino_output_transform4  dst[n][o][2ty+i][2tx+j] = (A^T m A)[i][j] for the positions inside dst, four
                          horizontally adjacent tiles per work-item (${T}4 lanes)
  wino_input_transform4   wino_input_transform for four adjacent tiles (shared input columns read once);
                          the [16][channels][tiles] layout only
  wino_grad_transform     Z[e][k][t]   = (A dy A^T)[e], dy = the 2x2 tile of the output gradient (zero outside)
  wino_filter_grad        gw[k][c]     = G^T Mw[.][k][c] G   (3x3 from the 16 accumulated products)

Tiles: t = (n * TH + ty) * TW + tx with TH = ceil(out_h / 2), TW = ceil(out_w / 2), so partial tiles at the
bottom/right borders are computed and their missing outputs simply not stored: any H, W works.

Template parameters (all have defaults):
  T      element type, "float" or "double"                              (default "float")
  FLIP        wino_filter_transform reads rotated, channel-swapped filters   (default 0)
  TILE_MAJOR  wino_input_transform writes the [16][groups][tiles][channels/groups] layout (default 0)
  BIAS        wino_output_transform4 adds bias[o] to every output of channel o (default False)
  RESIDUAL    wino_output_transform4 then adds residual[n][o][h][w], a tensor of dst's shape (default False)
  ACT         wino_output_transform4 then applies "none", "relu", "relu6" or "hardswish": an inference
              epilogue with the bits of the separate pass (netcl.runtime.cl_activation) (default "none")

Launch: the tile kernels (input, output, grad) are 3-D: (tx < TW, ty < TH, plane) (the *4 kernels:
(ceil(TW / 4), TH, plane)), so a work-item finds its tile without 64-bit divisions and neighbours along
dimension 0 write neighbouring tiles. The plane index is n * channels + channel, or with CMAJOR = 1
channel * NB + n: for small images (a few tiles per plane) that makes neighbouring planes write (read)
neighbouring tiles of the transformed matrix, instead of lines shared with planes far away in the grid.
The filter kernels are 2-D (inner channel, outer channel; wino_filter_transform8: (COLS / 8, ROWS)). Every kernel guards its tail; any local size
works (netcl.ops.conv_winograd picks them: _tile_local, _filter_local).

The file calls no OpenCL built-in function that takes or returns a vector (vloadN, vstoreN) and no min:
netcl.runtime.cl_vectors says why (the PoCL wheel on an AVX-512 Zen 4 crashed in wino_output_transform4 and
lost wino_filter_transform8 from its cached double programs).

Every kernel that reads or writes the 16 transformed matrices takes estride, the elements from one
matrix to the next (netcl.ops.conv_winograd.matrix_stride pads it off multiples of 4 KiB).
</%doc>
<%page args="T='float', FLIP=0, TILE_MAJOR=0, BIAS=False, RESIDUAL=False, ACT='none'"/>
<%namespace name="wm" file="_winograd_math.cl"/>
<%! from netcl.runtime.cl_vectors import vload, vstore, lesser %>
<%! from netcl.runtime.cl_activation import apply_epilogue %>
<%
def to_matrices(base, store=None):
    """element (i, j) of a transform to matrix 4i + j, from `base`: a plain store, or `store`(value, address)"""
    def put(i, j, value):
        at = f"{base} + (4 * {i} + {j}) * estride"
        return f"*({at}) = {value}" if store is None else store(value, at)
    return put
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

// (image, channel) of a plane index: n * CH + c, or with CMAJOR c * NB + n (see Launch above)
inline int2 plane_of(const int pl, const int NB, const int CH, const int CMAJOR)
{
    return CMAJOR ? (int2)(pl % NB, pl / NB) : (int2)(pl / CH, pl % CH);
}

__kernel void wino_input_transform(
    __global const ${T}* src, const long src_off,
    const int NB, const int CH, const int IH, const int IW, const int PAD_H, const int PAD_W,
    const int TH, const int TW, const int CMAJOR, const int GROUPS,
    __global ${T}* V, const long v_off, const long estride)
{
    const int tx = get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx >= TW || ty >= TH || pl >= NB * CH) return;
    const int2 nc = plane_of(pl, NB, CH, CMAJOR);
    const int n = nc.x, c = nc.y;
    const long tiles = (long)NB * TH * TW;
    const long t = ((long)n * TH + ty) * TW + tx;
    const int h0 = 2 * ty - PAD_H, w0 = 2 * tx - PAD_W;
    __global const ${T}* plane = src + src_off + ((long)n * CH + c) * IH * IW;
    ${T} d[4][4];
    for (int i = 0; i < 4; ++i) {
        const int h = h0 + i;
        for (int j = 0; j < 4; ++j) {
            const int w = w0 + j;
            d[i][j] = (h >= 0 && h < IH && w >= 0 && w < IW) ? plane[(long)h * IW + w] : (${T})0;
        }
    }
% if TILE_MAJOR:
    const int cpg = CH / GROUPS, grp = c / cpg;
    __global ${T}* out = V + v_off + ((long)grp * tiles + t) * cpg + (c - grp * cpg);
% else:
    __global ${T}* out = V + v_off + c * tiles + t;
% endif
${wm.input_transform(T, "d", to_matrices("out"))}\
}

// the first nt of four consecutive tiles' values
inline void store_tiles4(const ${T}4 v, __global ${T}* dst, const int nt)
{
    if (nt == 4) {
        ${vstore('v', 4, 'dst')}
    } else {
        dst[0] = v.s0;
        if (nt > 1) dst[1] = v.s1;
        if (nt > 2) dst[2] = v.s2;
    }
}

// Four horizontally adjacent tiles per work-item, as the lanes of ${T}4 vectors: the 4 x 10 input strip
// is read once (the tiles overlap by two columns) and each transformed element of the four tiles is
// one four-lane store (they are consecutive in t). Layout [16][CH][tiles] only.
__kernel void wino_input_transform4(
    __global const ${T}* src, const long src_off,
    const int NB, const int CH, const int IH, const int IW, const int PAD_H, const int PAD_W,
    const int TH, const int TW, const int CMAJOR,
    __global ${T}* V, const long v_off, const long estride)
{
    const int tx0 = 4 * get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx0 >= TW || ty >= TH || pl >= NB * CH) return;
    const int2 nc = plane_of(pl, NB, CH, CMAJOR);
    const int n = nc.x, c = nc.y;
    const int tiles_left = TW - tx0, nt = ${lesser('4', 'tiles_left')};
    const long tiles = (long)NB * TH * TW;
    const long t0 = ((long)n * TH + ty) * TW + tx0;
    const int h0 = 2 * ty - PAD_H, w0 = 2 * tx0 - PAD_W;
    __global const ${T}* plane = src + src_off + ((long)n * CH + c) * IH * IW;
    ${T}4 d[4][4];
    for (int i = 0; i < 4; ++i) {
        const int h = h0 + i;
        ${T} r[10];
        if (h >= 0 && h < IH && w0 >= 0 && w0 + 9 < IW) {
            __global const ${T}* row = plane + (long)h * IW + w0;
            for (int j = 0; j < 10; ++j) r[j] = row[j];
        } else {
            for (int j = 0; j < 10; ++j) {
                const int w = w0 + j;
                r[j] = (h >= 0 && h < IH && w >= 0 && w < IW) ? plane[(long)h * IW + w] : (${T})0;
            }
        }
        for (int j = 0; j < 4; ++j) d[i][j] = (${T}4)(r[j], r[j + 2], r[j + 4], r[j + 6]);
    }
    __global ${T}* out = V + v_off + c * tiles + t0;
${wm.input_transform(T + "4", "d", to_matrices("out", lambda value, at: f"store_tiles4({value}, {at}, nt)"))}\
}

// Four adjacent tiles per work-item (the lanes of ${T}4 vectors), M in the [16][CH][tiles] layout; bias
// and residual are read only with BIAS and RESIDUAL.
__kernel void wino_output_transform4(
    __global const ${T}* M, const long m_off, const long estride,
    const int NB, const int CH, const int OH, const int OW, const int TH, const int TW, const int CMAJOR,
    __global ${T}* dst, const long dst_off,
    __global const ${T}* bias, const long bias_off, __global const ${T}* residual, const long residual_off)
{
    const int tx0 = 4 * get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx0 >= TW || ty >= TH || pl >= NB * CH) return;
    const int2 nc = plane_of(pl, NB, CH, CMAJOR);
    const int n = nc.x, o = nc.y;
    const int tiles_left = TW - tx0, nt = ${lesser('4', 'tiles_left')};
    const long tiles = (long)NB * TH * TW;
    const long t0 = ((long)n * TH + ty) * TW + tx0;
    __global const ${T}* in = M + m_off + o * tiles + t0;
    ${T}4 m[4][4];
    for (int e = 0; e < 16; ++e) {
        __global const ${T}* src = in + e * estride;
        m[e / 4][e % 4] = nt == 4 ? ${vload(T + '4', 4, 'src')}
            : (${T}4)(src[0], nt > 1 ? src[1] : (${T})0, nt > 2 ? src[2] : (${T})0, (${T})0);
    }
    ${T}4 y[2][2];
${wm.output_transform(T + "4", "m", lambda i, j, value: f"y[{i}][{j}] = {value}")}\
    const long plane_at = ((long)n * CH + o) * OH * OW;
    __global ${T}* plane = dst + dst_off + plane_at;
    for (int i = 0; i < 2; ++i) {
        const int h = 2 * ty + i;
        if (h >= OH) break;
        const ${T}4 y0 = y[i][0], y1 = y[i][1];
        const ${T} ys[8] = {y0.s0, y1.s0, y0.s1, y1.s1, y0.s2, y1.s2, y0.s3, y1.s3};
        const long row_at = (long)h * OW + 2 * tx0;
        __global ${T}* row = plane + row_at;
        const int cols_left = OW - 2 * tx0, cols = ${lesser('8', 'cols_left')};
        for (int j = 0; j < cols; ++j) {
            ${T} out = ys[j];
            ${apply_epilogue("out", T, "bias[bias_off + o]" if BIAS else None,
                             "residual[residual_off + plane_at + row_at + j]" if RESIDUAL else None, ACT)}
            row[j] = out;
        }
    }
}

// Rows o in [0, ROWS), columns i in [0, COLS); FLIP=0: ROWS = K, COLS = CG; FLIP=1: ROWS = C, COLS = KG.
__kernel void wino_filter_transform(
    __global const ${T}* w, const long w_off,
    const int ROWS, const int COLS, const int CG, const int KG,
    __global ${T}* U, const long u_off, const long estride)
{
    const int i = get_global_id(0), o = get_global_id(1);
    if (i >= COLS || o >= ROWS) return;
    ${T} g[3][3];
% if FLIP:
    const int grp = o / CG, cc = o - grp * CG;
    __global const ${T}* src = w + w_off + ((long)(grp * KG + i) * CG + cc) * 9;
    for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) g[r][s] = src[(2 - r) * 3 + (2 - s)];
% else:
    __global const ${T}* src = w + w_off + ((long)o * CG + i) * 9;
    for (int r = 0; r < 3; ++r)
        for (int s = 0; s < 3; ++s) g[r][s] = src[r * 3 + s];
% endif
    __global ${T}* out = U + u_off + (long)o * COLS + i;
${wm.filter_transform(T, T, "g", to_matrices("out"))}\
}

// Rows o, columns i0..i0+7 in the lanes of ${T}8 vectors: the taps w[o][i0..i0+7][3][3] are read as nine
// vector loads and regrouped by tap (lane l of tap rs is element 9l + rs of the run), instead of nine
// stride-9 gathers (512x512 filters on PoCL: 1.95 -> 1.03 ms).
__kernel void wino_filter_transform8(
    __global const ${T}* w, const long w_off, const int ROWS, const int COLS,
    __global ${T}* U, const long u_off, const long estride)
{
    const int i0 = 8 * get_global_id(0), o = get_global_id(1);
    if (i0 >= COLS || o >= ROWS) return;
    __global const ${T}* src = w + w_off + ((long)o * COLS + i0) * 9;
    ${T}8 v[9];
    for (int q = 0; q < 9; ++q) v[q] = ${vload(T + '8', 8, 'src + 8 * q')};
    ${T}8 g[3][3];
% for rs in range(9):
    g[${rs // 3}][${rs % 3}] = (${T}8)(${", ".join(f"v[{(9 * lane + rs) // 8}].s{(9 * lane + rs) % 8}" for lane in range(8))});
% endfor
    __global ${T}* out = U + u_off + (long)o * COLS + i0;
${wm.filter_transform(T + "8", T, "g", to_matrices("out", lambda value, at: vstore(value, 8, at).rstrip(';')))}\
}

__kernel void wino_grad_transform(
    __global const ${T}* gy, const long gy_off,
    const int NB, const int CH, const int OH, const int OW, const int TH, const int TW, const int CMAJOR,
    __global ${T}* Z, const long z_off, const long estride)
{
    const int tx = get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx >= TW || ty >= TH || pl >= NB * CH) return;
    const int2 nc = plane_of(pl, NB, CH, CMAJOR);
    const int n = nc.x, k = nc.y;
    const long tiles = (long)NB * TH * TW;
    const long t = ((long)n * TH + ty) * TW + tx;
    __global const ${T}* plane = gy + gy_off + ((long)n * CH + k) * OH * OW;
    ${T} d[2][2];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) {
            const int h = 2 * ty + i, w = 2 * tx + j;
            d[i][j] = (h < OH && w < OW) ? plane[(long)h * OW + w] : (${T})0;
        }
    ${T} a[4][2];
    for (int j = 0; j < 2; ++j) {
        a[0][j] = d[0][j];
        a[1][j] = d[0][j] + d[1][j];
        a[2][j] = d[0][j] - d[1][j];
        a[3][j] = -d[1][j];
    }
    __global ${T}* out = Z + z_off + k * tiles + t;
    for (int i = 0; i < 4; ++i) {
        out[(4 * i + 0) * estride] = a[i][0];
        out[(4 * i + 1) * estride] = a[i][0] + a[i][1];
        out[(4 * i + 2) * estride] = a[i][0] - a[i][1];
        out[(4 * i + 3) * estride] = -a[i][1];
    }
}

// Mw is [16][K][CG]; gw is the (K, CG, 3, 3) weight gradient.
__kernel void wino_filter_grad(
    __global const ${T}* Mw, const long m_off, const long estride, const int K, const int CG,
    __global ${T}* gw, const long gw_off)
{
    const int c = get_global_id(0), k = get_global_id(1);
    if (c >= CG || k >= K) return;
    __global const ${T}* in = Mw + m_off + (long)k * CG + c;
    ${T} m[4][4];
    for (int e = 0; e < 16; ++e) m[e / 4][e % 4] = in[e * estride];
    const ${T} hf = (${T})0.5;
    ${T} a[3][4];
    for (int j = 0; j < 4; ++j) {
        a[0][j] = m[0][j] + hf * (m[1][j] + m[2][j]);
        a[1][j] = hf * (m[1][j] - m[2][j]);
        a[2][j] = hf * (m[1][j] + m[2][j]) + m[3][j];
    }
    __global ${T}* out = gw + gw_off + ((long)k * CG + c) * 9;
    for (int i = 0; i < 3; ++i) {
        out[i * 3 + 0] = a[i][0] + hf * (a[i][1] + a[i][2]);
        out[i * 3 + 1] = hf * (a[i][1] - a[i][2]);
        out[i * 3 + 2] = hf * (a[i][1] + a[i][2]) + a[i][3];
    }
}
