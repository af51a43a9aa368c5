<%doc>
Winograd F(4x4, 3x3) transforms (Lavin & Gray, interpolation points 0, ±1, ±2 and infinity): every 4x4
output tile is A^T [ (G g G^T) (.) (B^T d B) ] A of the 6x6 input patch d and the 3x3 filter g, 36
element-wise products per tile instead of 144 multiplies (4x fewer; F(2x2, 3x3) in kernels/winograd.cl
saves 2.25x). The channel sums of those products are 36 batched GEMMs run by netcl.ops.gemm between the
transforms below. Layouts as kernels/winograd.cl's: [36][channels][tiles] for the transformed input and
product, [36][rows][cols] for the filters, each of the 36 a contiguous matrix `estride` elements after the
one before (netcl.ops.conv_winograd.matrix_stride).

  wino4_input_transform   V[e][c][t] = (B^T d B)[e], d the 6x6 patch of src at (4*ty - PAD_H, 4*tx - PAD_W),
                          zero outside the source (PAD may be negative); VW horizontally adjacent tiles
                          per work-item, in the lanes of a vector (their 6 x (4*VW + 2) input strip is
                          read once: neighbouring tiles overlap by two columns)
  wino4_filter_transform  U[e][o][i] = (G g G^T)[e]; FLIP=0: g = w[o][i] (forward: o output channel, i input
                          channel of its group); FLIP=1: g = rot180(w[grp*KG + i][o - grp*CG]) (backward data:
                          o input channel, i output channel of its group)
  wino4_output_transform  dst[n][o][4ty+i][4tx+j] = (A^T m A)[i][j] for the positions inside dst, VW adjacent
                          tiles per work-item, then the inference epilogue (bias, residual, activation)
  wino4_grad_transform    Z[e][k][t] = (A dy A^T)[e], dy the 4x4 tile of the output gradient (zero past its
                          border), VW adjacent tiles per work-item (backward_weight, the transposed algorithm:
                          gw = G^T [Σ over tiles of Z (.) V] G, the sums 36 batched GEMMs Z·V^T)
  wino4_filter_grad       gw[k][c] = G^T Mw[.][k][c] G (3x3 from the 36 summed products)

Tiles: t = (n * TH + ty) * TW + tx with TH = ceil(out_h / 4), TW = ceil(out_w / 4); partial tiles at the
bottom and right are computed and their missing outputs not stored, so any size works.

The matrices, with e = 6i + j the element (i, j) of a 6x6 transform:
  B^T = [4 0 -5 0 1 0; 0 -4 -4 1 1 0; 0 4 -4 -1 1 0; 0 -2 -1 2 1 0; 0 2 -1 -2 1 0; 0 4 0 -5 0 1]
  G   = [1/4 0 0; -1/6 -1/6 -1/6; -1/6 1/6 -1/6; 1/24 1/12 1/6; 1/24 -1/12 1/6; 0 0 1]
  A^T = [1 1 1 1 1 0; 0 1 -1 2 -2 0; 0 1 1 4 4 0; 0 1 -1 8 -8 1]
The template expands each product with a matrix into its nonzero terms (linear_combination below), so
the kernels carry no matrix in memory and multiply only by coefficients other than ±1.

Template parameters (all have defaults):
  T       element type, "float" or "double"                                   (default "float")
  VW      tiles per work-item of the input and output transforms: 1, 2, 4, 8 or 16 (default 4)
  FLIP    wino4_filter_transform reads rotated, channel-swapped filters        (default 0)
  BIAS    wino4_output_transform adds bias[o] to every output of channel o     (default False)
  RESIDUAL  wino4_output_transform then adds residual[n][o][h][w], a tensor of dst's shape (default False)
  ACT     wino4_output_transform then applies "none", "relu", "relu6" or "hardswish": an inference
          epilogue with the bits of the separate pass (netcl.runtime.cl_activation) (default "none")

Launch: the input, output and gradient transforms are 3-D, (ceil(TW / VW), TH, NB * CH) with the plane
index n * CH + c; the filter transform is 2-D (COLS, ROWS), the filter gradient (CG, K). Every kernel guards its tail; any local size works
(netcl.ops.conv_winograd4 picks them).

Like kernels/winograd.cl, the file calls no OpenCL built-in function that takes or returns a vector
(netcl.runtime.cl_vectors says why).
</%doc>
<%page args="T='float', VW=4, FLIP=0, BIAS=False, RESIDUAL=False, ACT='none'"/>
<%!
from fractions import Fraction

from netcl.runtime.cl_activation import apply_epilogue
from netcl.runtime.cl_vectors import vload, vstore, lesser

B_T = [[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0],
       [0, -2, -1, 2, 1, 0], [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]]
G = [[Fraction(1, 4), 0, 0], [Fraction(-1, 6), Fraction(-1, 6), Fraction(-1, 6)],
     [Fraction(-1, 6), Fraction(1, 6), Fraction(-1, 6)], [Fraction(1, 24), Fraction(1, 12), Fraction(1, 6)],
     [Fraction(1, 24), Fraction(-1, 12), Fraction(1, 6)], [0, 0, 1]]
A_T = [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]]


def coefficient(value, scalar):
    """A rational coefficient as a C constant of type ``scalar`` (a quotient the compiler folds)."""
    value = Fraction(value)
    if value.denominator == 1:
        return "(%s)%d" % (scalar, value.numerator)
    return "((%s)%d / (%s)%d)" % (scalar, value.numerator, scalar, value.denominator)


def linear_combination(row, terms, scalar):
    """Σ row[k] · terms[k] over the nonzero coefficients, as C text: a ±1 coefficient adds or subtracts
    the term itself."""
    text = ""
    for c, term in zip(row, terms):
        if c == 0:
            continue
        magnitude = abs(Fraction(c))
        product = term if magnitude == 1 else "%s * %s" % (coefficient(magnitude, scalar), term)
        if not text:
            text = product if c > 0 else "-" + product
        else:
            text += (" + " if c > 0 else " - ") + product
    return "(%s)" % text


def lane(value, width, index):
    return value if width == 1 else "(%s).s%x" % (value, index)


def accumulate_row(target, coefficients, k, sources, scalar):
    """Statements adding input row k (the C values ``sources``, one per column j) into the rows of
    ``target`` (a C array [i][j]) with coefficients(i, k): target[i][j] += coefficients(i, k) · sources[j].
    Applied as the rows k = 0, 1, ... arrive, so the first nonzero coefficient of a target row assigns."""
    lines = []
    for i in range(coefficients.rows):
        c = coefficients(i, k)
        if c == 0:
            continue
        first = all(coefficients(i, kk) == 0 for kk in range(k))
        for j, source in enumerate(sources):
            term = source if abs(c) == 1 else "%s * %s" % (coefficient(abs(c), scalar), source)
            if first:
                lines.append("%s[%d][%d] = %s%s;" % (target, i, j, "-" if c < 0 else "", term))
            else:
                lines.append("%s[%d][%d] %s %s;" % (target, i, j, "+=" if c > 0 else "-=", term))
    return "\n        ".join(lines)


class Coefficients:
    """matrix[i][k] (or, transposed, matrix[k][i]) as a callable of (i, k) with its number of rows i."""

    def __init__(self, matrix, transposed=False):
        self.matrix, self.transposed = matrix, transposed
        self.rows = len(matrix[0]) if transposed else len(matrix)

    def __call__(self, i, k):
        return self.matrix[k][i] if self.transposed else self.matrix[i][k]


def store_lanes(value, at, width):
    """Statements storing the ``nt`` valid lanes (tiles) of ``value`` at ``at``: one vector store when
    all ``width`` are, else lane by lane."""
    if width == 1:
        return "*(%s) = %s;" % (at, value)
    lanes = " ".join("if (nt > %d) (%s)[%d] = %s;" % (l, at, l, lane(value, width, l)) for l in range(width - 1))
    return "if (nt == %d) { %s } else { %s }" % (width, vstore(value, width, at), lanes)
%>
<%
    VT = T if VW == 1 else T + str(VW)
    SPAN = 4 * VW + 2   # input columns of VW adjacent tiles
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void wino4_input_transform(
    __global const ${T}* src, const long src_off,
    const int NB, const int CH, const int IH, const int IW, const int PAD_H, const int PAD_W,
    const int TH, const int TW,
    __global ${T}* V, const long v_off, const long estride)
{
    const int tx0 = ${VW} * get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx0 >= TW || ty >= TH || pl >= NB * CH) return;
    const int n = pl / CH, c = pl - n * CH;
    const int tiles_left = TW - tx0, nt = ${lesser(str(VW), 'tiles_left')};
    const long tiles = (long)NB * TH * TW;
    const int h0 = 4 * ty - PAD_H, w0 = 4 * tx0 - PAD_W;
    __global const ${T}* plane = src + src_off + ((long)n * CH + c) * IH * IW;
    /* B^T applied down the columns as the rows arrive: bt_d[i][j] = Σ_k B^T[i][k] d[k][j] */
    ${VT} bt_d[6][6];
% for k in range(6):
    {
        const int h = h0 + ${k};
% for j in range(6):
        ${VT} d${k}_${j};
% endfor
        if (h >= 0 && h < IH && w0 >= 0 && w0 + ${SPAN - 1} < IW) {
            /* tile l's first four columns as one vector each, their lanes regrouped by column */
            __global const ${T}* row = plane + (long)h * IW + w0;
% for l in range(VW):
            const ${T}4 q${l} = ${vload(T + "4", 4, "row + %d" % (4 * l))};
% endfor
% for j in range(6):
            d${k}_${j} = (${VT})(${", ".join(("q%d.s%d" % (l + j // 4, j % 4)) if l + j // 4 < VW else "row[%d]" % (4 * l + j) for l in range(VW))});
% endfor
        } else {
            ${T} r[${SPAN}];
            for (int j = 0; j < ${SPAN}; ++j) {
                const int w = w0 + j;
                r[j] = (h >= 0 && h < IH && w >= 0 && w < IW) ? plane[(long)h * IW + w] : (${T})0;
            }
% for j in range(6):
            d${k}_${j} = (${VT})(${", ".join("r[%d]" % (4 * l + j) for l in range(VW))});
% endfor
        }
        ${accumulate_row("bt_d", Coefficients(B_T), k, ["d%d_%d" % (k, j) for j in range(6)], T)}
    }
% endfor
    __global ${T}* out = V + v_off + c * tiles + ((long)n * TH + ty) * TW + tx0;
% for i in range(6):
% for j in range(6):
    {
        const ${VT} value = ${linear_combination(B_T[j], ["bt_d[%d][%d]" % (i, k) for k in range(6)], T)};
        __global ${T}* at = out + ${6 * i + j} * estride;
        ${store_lanes("value", "at", VW)}
    }
% endfor
% endfor
}

// Rows o in [0, ROWS), columns i in [0, COLS); FLIP=0: ROWS = K, COLS = CG; FLIP=1: ROWS = C, COLS = KG.
__kernel void wino4_filter_transform(
    __global const ${T}* w, const long w_off,
    const int ROWS, const int COLS, const int CG, const int KG,
    __global ${T}* U, const long u_off, const long estride)
{
    const int i = get_global_id(0), o = get_global_id(1);
    if (i >= COLS || o >= ROWS) return;
% if FLIP:
    const int grp = o / CG, cc = o - grp * CG;
    __global const ${T}* src = w + w_off + ((long)(grp * KG + i) * CG + cc) * 9;
% for r in range(3):
% for s in range(3):
    const ${T} g${r}_${s} = src[${(2 - r) * 3 + (2 - s)}];
% endfor
% endfor
% else:
    __global const ${T}* src = w + w_off + ((long)o * CG + i) * 9;
% for r in range(3):
% for s in range(3):
    const ${T} g${r}_${s} = src[${r * 3 + s}];
% endfor
% endfor
% endif
    __global ${T}* out = U + u_off + (long)o * COLS + i;
% for a in range(6):
% for s in range(3):
    const ${T} gg${a}_${s} = ${linear_combination(G[a], ["g%d_%d" % (r, s) for r in range(3)], T)};
% endfor
% for b in range(6):
    out[${6 * a + b} * estride] = ${linear_combination(G[b], ["gg%d_%d" % (a, s) for s in range(3)], T)};
% endfor
% endfor
}

// VW adjacent tiles per work-item (the lanes of ${VT} values), M in the [36][CH][tiles] layout; bias and
// residual are read only with BIAS and RESIDUAL.
__kernel void wino4_output_transform(
    __global const ${T}* M, const long m_off, const long estride,
    const int NB, const int CH, const int OH, const int OW, const int TH, const int TW,
    __global ${T}* dst, const long dst_off,
    __global const ${T}* bias, const long bias_off, __global const ${T}* residual, const long residual_off)
{
    const int tx0 = ${VW} * get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx0 >= TW || ty >= TH || pl >= NB * CH) return;
    const int n = pl / CH, o = pl - n * CH;
    const int tiles_left = TW - tx0, nt = ${lesser(str(VW), 'tiles_left')};
    const long tiles = (long)NB * TH * TW;
    __global const ${T}* in = M + m_off + o * tiles + ((long)n * TH + ty) * TW + tx0;
    /* A^T applied down the columns as the rows of m arrive: at_m[i][j] = Σ_k A^T[i][k] m[k][j] */
    ${VT} at_m[4][6];
% for k in range(6):
    {
% for j in range(6):
        ${VT} m${j};
        {
            __global const ${T}* at = in + ${6 * k + j} * estride;
% if VW == 1:
            m${j} = *at;
% else:
            m${j} = nt == ${VW} ? ${vload(VT, VW, "at")}
                : (${VT})(${", ".join("nt > %d ? at[%d] : (%s)0" % (l, l, T) for l in range(VW))});
% endif
        }
% endfor
        ${accumulate_row("at_m", Coefficients(A_T), k, ["m%d" % j for j in range(6)], T)}
    }
% endfor
    const long plane_at = ((long)n * CH + o) * OH * OW;
    __global ${T}* plane = dst + dst_off + plane_at;
    const int cols_left = OW - 4 * tx0, cols = ${lesser(str(4 * VW), 'cols_left')};
% for i in range(4):
    if (4 * ty + ${i} < OH) {
% for j in range(4):
        const ${VT} y${j} = ${linear_combination(A_T[j], ["at_m[%d][%d]" % (i, k) for k in range(6)], T)};
% endfor
        /* output column 4·lane + j of the strip */
        const ${T} ys[${4 * VW}] = {${", ".join(lane("y%d" % j, VW, l) for l in range(VW) for j in range(4))}};
        const long row_at = (long)(4 * ty + ${i}) * OW + 4 * tx0;
        __global ${T}* row = plane + row_at;
        for (int j = 0; j < cols; ++j) {
            ${T} out = ys[j];
            ${apply_epilogue("out", T, "bias[bias_off + o]" if BIAS else None,
                             "residual[residual_off + plane_at + row_at + j]" if RESIDUAL else None, ACT)}
            row[j] = out;
        }
    }
% endfor
}

// Z[e][k][t] = (A dy A^T)[e] of the 4x4 tile of the output gradient at (4ty, 4tx) (zero past its border),
// VW adjacent tiles per work-item: backward_weight's transform of the gradient (A = (A^T)^T, 6x4).
__kernel void wino4_grad_transform(
    __global const ${T}* gy, const long gy_off,
    const int NB, const int CH, const int OH, const int OW, const int TH, const int TW,
    __global ${T}* Z, const long z_off, const long estride)
{
    const int tx0 = ${VW} * get_global_id(0), ty = get_global_id(1), pl = get_global_id(2);
    if (tx0 >= TW || ty >= TH || pl >= NB * CH) return;
    const int n = pl / CH, k = pl - n * CH;
    const int tiles_left = TW - tx0, nt = ${lesser(str(VW), 'tiles_left')};
    const long tiles = (long)NB * TH * TW;
    const int w0 = 4 * tx0;
    __global const ${T}* plane = gy + gy_off + ((long)n * CH + k) * OH * OW;
    /* A applied down the columns as the rows arrive: a_dy[a][j] = Σ_i A[a][i] dy[i][j] */
    ${VT} a_dy[6][4];
% for i in range(4):
    {
        const int h = 4 * ty + ${i};
% for j in range(4):
        ${VT} dy${i}_${j};
% endfor
        if (h < OH && w0 + ${4 * VW - 1} < OW) {
            /* tile l's row as one vector, the lanes regrouped by column (as in wino4_input_transform) */
            __global const ${T}* row = plane + (long)h * OW + w0;
% for l in range(VW):
            const ${T}4 q${l} = ${vload(T + "4", 4, "row + %d" % (4 * l))};
% endfor
% for j in range(4):
            dy${i}_${j} = (${VT})(${", ".join("q%d.s%d" % (l, j) for l in range(VW))});
% endfor
        } else {
            ${T} r[${4 * VW}];
            for (int j = 0; j < ${4 * VW}; ++j)
                r[j] = h < OH && w0 + j < OW ? plane[(long)h * OW + w0 + j] : (${T})0;
% for j in range(4):
            dy${i}_${j} = (${VT})(${", ".join("r[%d]" % (4 * l + j) for l in range(VW))});
% endfor
        }
        ${accumulate_row("a_dy", Coefficients(A_T, transposed=True), i, ["dy%d_%d" % (i, j) for j in range(4)], T)}
    }
% endfor
    __global ${T}* out = Z + z_off + k * tiles + ((long)n * TH + ty) * TW + tx0;
% for a in range(6):
% for b in range(6):
    {
        const ${VT} value = ${linear_combination([A_T[j][b] for j in range(4)], ["a_dy[%d][%d]" % (a, j) for j in range(4)], T)};
        __global ${T}* at = out + ${6 * a + b} * estride;
        ${store_lanes("value", "at", VW)}
    }
% endfor
% endfor
}

// gw[k][c] = G^T Mw[.][k][c] G: the 3x3 weight gradient from the 36 products summed over every tile
// (Mw is [36][K][CG], gw the (K, CG, 3, 3) weight gradient).
__kernel void wino4_filter_grad(
    __global const ${T}* Mw, const long m_off, const long estride, const int K, const int CG,
    __global ${T}* gw, const long gw_off)
{
    const int c = get_global_id(0), k = get_global_id(1);
    if (c >= CG || k >= K) return;
    __global const ${T}* in = Mw + m_off + (long)k * CG + c;
% for a in range(6):
% for b in range(6):
    const ${T} m${a}_${b} = in[${6 * a + b} * estride];
% endfor
% endfor
    __global ${T}* out = gw + gw_off + ((long)k * CG + c) * 9;
% for r in range(3):
% for b in range(6):
    const ${T} gm${r}_${b} = ${linear_combination([G[a][r] for a in range(6)], ["m%d_%d" % (a, b) for a in range(6)], T)};
% endfor
% for s in range(3):
    out[${r * 3 + s}] = ${linear_combination([G[b][s] for b in range(6)], ["gm%d_%d" % (r, b) for b in range(6)], T)};
% endfor
% endfor
}
