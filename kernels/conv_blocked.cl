<%doc>
Register-blocked direct convolution (the `direct_blocked` strategy): dilation 1, one group, NCHW
tensors, KCRS weight; stride 1, or any STRIDE for the forward pass and the weight gradient. A work-item
owns a block of outputs held in vector registers for the whole reduction: KB output channels ×
(ROWS × QW) output positions (ROWS consecutive rows, QW consecutive columns each), one T<QW*ROWS>
vector per output channel. Per input channel and kernel row it loads the input rows its positions read
once, builds the S shifted vectors the kernel's columns need from them by lane selection (no reload per
tap, no bounds test per element), and runs KB·S multiply-adds of a broadcast weight against them: the loop oneDNN's direct convolution runs on AVX, written so that a
CPU OpenCL compiler keeps the accumulators in registers.

  conv_blocked_output  MODE "output": Y[n, k, p, q] = Σ_{c,r,s} X[n, c, STRIDE·p + r − PH, STRIDE·q + s − PW] · Wt(k, c, r, s)
                       forward:        X = x, Y = y,   Wt(k, c, r, s) = w[k, c, r, s]
                       backward_data:  X = gy, Y = gx, Wt(c, k, r, s) = w[k, c, R−1−r, S−1−s] (packed with FLIP), with
                                       padding R−1−PH, S−1−PW (the transposed convolution of stride 1;
                                       STRIDE 1 only)
                       Wt is read packed (Wp, below), so that the KB·S weights one step of the
                       reduction multiplies are adjacent: read from the KCRS weight in place they lie
                       CI·R·S elements apart, a stride that maps the KB channels onto few cache sets.
  conv_blocked_pack    MODE "pack":   Wp[(((k / KB) · CI + c) · R + r) · S + s) · KB + k % KB] = Wt(k, c, r, s),
                       a work-item per KB weights (k / KB, c, r, s); FLIP packs backward_data's Wt (CO, CI
                       as the output kernel sees them), so the output kernel itself has no FLIP
  conv_blocked_weight  MODE "weight": part[b, k, c, r, s] = Σ_{n in chunk b, p, q} gy[n, k, p, q] · x[n, c, STRIDE·p + r − PH, STRIDE·q + s − PW];
                       a work-item owns (chunk b of IMAGES images, c, r) and KB output channels: KB × S
                       vector accumulators summed across lanes at the end (no atomics, deterministic).
                       The work-items of one chunk run together and share its images in cache; the
                       host sums the chunks' partial gradients (one chunk writes gw directly).

Template parameters (all have defaults):
  T      element type, "float" or "double"                                       (default "float")
  MODE   "output", "weight" or "pack"                                            (default "output")
  FLIP   pack mode: Wt is backward_data's flipped, transposed weight              (default False)
  KB     output channels per work-item (the host picks a divisor of the count)   (default 8)
  QW     output columns per work-item row; QW·ROWS ∈ {2, 4, 8, 16} lanes          (default 16)
  ROWS   output rows per work-item                                               (default 1)
  S      kernel width (compiled in: it fixes the lane selections)                (default 3)
  STRIDE stride along rows and columns (compiled in: it fixes the lane selections; a row block loads
         STRIDE·QW consecutive input columns and takes every STRIDE-th)          (default 1)
  PW     padding on the left of a row, as this kernel sees it                    (default 1)
  BIAS   output mode: add bias[k] to every output of channel k                   (default False)
  RESIDUAL  output mode, forward: then add residual[n, k, p, q] (a tensor of the output's shape)
                                                                                 (default False)
  ACT    output mode, forward: then apply "none", "relu", "relu6" or "hardswish" (an inference epilogue:
         z = acc + bias; z += residual; activation; the text is netcl.runtime.cl_activation's, so the
         result has the bits of the separate pass kernels/batchnorm.cl's bn_apply makes)  (default "none")
  TAIL   some work-items' blocks reach past the output's rows or columns (or their input row past
         the input's width), so loads and stores test bounds; False compiles only the unmasked path,
         which keeps the register allocator from spilling the accumulators for a path never taken
                                                                                 (default True)
  SHIFT  an output (weight mode: output gradient) at least QW wide and ROWS high: a block that would
         reach past the last column (row) starts early enough to end on it, overlapping its
         neighbour; output mode stores the same values there as the neighbour, weight mode weighs the
         overlapped lanes 0. Every store or gradient load is then a whole block without lane tests
         (with them in the kernel, Intel's CPU compiler slows its whole reduction loop down), and
         TAIL only has the input loads tested                                    (default False)

Scalar arguments: output mode (N, CI, HI, WI, CO, HO, WO, R, PH) = batch, input channels and size,
output channels and size, kernel height, top padding, then the bias and the residual (buffer, offset;
any buffer where unused); weight mode (N, C, H, W, K, P, Q, R, PH) = batch,
input channels and size, output channels and size, kernel height, top padding, images per chunk;
pack mode (CO, CI, R).

Launch (work-groups of one work-item, as kernels/implicit_gemm.cl says why):
  output: global (ceil(WO/QW), ceil(HO/ROWS), N·CO/KB), local (1, 1, 1)
  weight: global (C, R, K/KB · chunks), local (1, 1, 1)
  pack:   global (CO/KB · CI·R·S, rounded up to the work-group size), any local size

Vectors are assembled from element loads (a strided block's whole input rows: unaligned vector loads)
and read back lane by lane: no OpenCL built-in takes or returns a vector here (netcl.runtime.cl_vectors
says why).
</%doc>
<%!
def lane_source(j, offset, span):
    """The register holding input column xq + offset of loaded row j: a left edge, the middle run of
    ``span`` columns or a right edge."""
    if offset < 0:
        return "L%d_%d" % (j, -offset - 1)
    if offset >= span:
        return "E%d_%d" % (j, offset - span)
    return "M%d_%d" % (j, offset)


def chunk_width(span):
    """The widest vector (at most 16 lanes) that tiles a strided block's ``span`` loaded columns."""
    return max(c for c in (2, 4, 8, 16) if span % c == 0)
%>
<%! from netcl.runtime.cl_activation import apply_activation %>
<%! from netcl.runtime.cl_vectors import unaligned_load, unaligned_vector_typedef %>
<%page args="T='float', MODE='output', FLIP=False, KB=8, QW=16, ROWS=1, S=3, STRIDE=1, PW=1, BIAS=False, TAIL=True, SHIFT=False, RESIDUAL=False, ACT='none'"/>
<%
    LANES = QW * ROWS
    VT = T + str(LANES)
    RIGHT = max(0, S - 1 - PW)
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
% if STRIDE > 1:
${unaligned_vector_typedef(T + str(chunk_width(STRIDE * QW)), 8 if T == "double" else 4)}
% endif

<%def name="load_rows(xc, h0, width, full, T, QW, ROWS, S, PW, TAIL, STRIDE)">
<%
    VT = T + str(QW * ROWS)
    SPAN = STRIDE * QW
    CHUNK = chunk_width(SPAN)
    RIGHT = max(0, S - PW - STRIDE)
%>            /* input rows h0 + STRIDE·j, columns xq − PW … xq + STRIDE·(QW − 1) + S − 1 − PW (xq = STRIDE·qb),
               zero outside the tensor */
% for j in range(ROWS):
            ${T} ${', '.join('M%d_%d = 0' % (j, l) for l in range(SPAN))};
% if PW:
            ${T} ${', '.join('L%d_%d = 0' % (j, i) for i in range(PW))};
% endif
% if RIGHT:
            ${T} ${', '.join('E%d_%d = 0' % (j, i) for i in range(RIGHT))};
% endif
            if ((uint)(${h0} + ${j * STRIDE}) < (uint)H_IN) {
                __global const ${T}* row = ${xc} + (long)(${h0} + ${j * STRIDE}) * ${width};
% if TAIL:
                if (${full}) {
% endif
% if STRIDE > 1:
                    /* whole vectors: a strided stem's weight gradient ran faster so than from element
                       loads on Debian's PoCL and on Intel's runtime */
% for h in range(SPAN // CHUNK):
                    const ${T}${CHUNK} V${j}_${h} = ${unaligned_load(CHUNK, 'row', 'xq + %d' % (h * CHUNK))};
% endfor
% for l in range(SPAN):
                    M${j}_${l} = V${j}_${l // CHUNK}.s${'%x' % (l % CHUNK)};
% endfor
% else:
% for l in range(SPAN):
                    M${j}_${l} = row[xq + ${l}];
% endfor
% endif
% if TAIL:
                } else {
% for l in range(SPAN):
                    if (xq + ${l} < ${width}) M${j}_${l} = row[xq + ${l}];
% endfor
                }
% endif
% for i in range(PW):
                if ((uint)(xq - ${i + 1}) < (uint)${width}) L${j}_${i} = row[xq - ${i + 1}];
% endfor
% for i in range(RIGHT):
                if (xq + ${SPAN + i} < ${width}) E${j}_${i} = row[xq + ${SPAN + i}];
% endfor
            }
% endfor
% for s in range(S):
            const ${VT} xs${s} = (${VT})(${', '.join(lane_source(j, STRIDE * l + s - PW, SPAN) for j in range(ROWS) for l in range(QW))});
% endfor
</%def>

<%def name="weight_steps(masked, T, QW, ROWS, S, KB)">
<%doc>  masked: False (whole vectors), True (each lane's load tested against P and Q) or "keep" (whole
        vectors, times the 0/1 lanes of the vector `keep`)</%doc>
<%
    VT = T + str(QW * ROWS)
%>\
% for kk in range(KB):
                    {
% for j in range(ROWS):
                        __global const ${T}* grow${j} = gn + ((long)${kk} * P + p0 + ${j}) * Q + qb;
% if masked is True:
                        ${T} ${', '.join('G%d_%d = 0' % (j, l) for l in range(QW))};
                        if (p0 + ${j} < P) {
% for l in range(QW):
                            if (qb + ${l} < Q) G${j}_${l} = grow${j}[${l}];
% endfor
                        }
% endif
% endfor
% if masked is True:
                        const ${VT} gv = (${VT})(${', '.join('G%d_%d' % (j, l) for j in range(ROWS) for l in range(QW))});
% elif masked == "keep":
                        const ${VT} gv = (${VT})(${', '.join('grow%d[%d]' % (j, l) for j in range(ROWS) for l in range(QW))}) * keep;
% else:
                        const ${VT} gv = (${VT})(${', '.join('grow%d[%d]' % (j, l) for j in range(ROWS) for l in range(QW))});
% endif
% for s in range(S):
                        acc${kk}_${s} = gv * xs${s} + acc${kk}_${s};
% endfor
                    }
% endfor
</%def>

% if MODE == 'output':
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv_blocked_output(
    __global const ${T}* X, const long x_off,
    __global const ${T}* Wp, const long wp_off,
    __global ${T}* Y, const long y_off,
    const int N, const int CI, const int H_IN, const int W_IN, const int CO, const int HO, const int WO,
    const int R, const int PH,
    __global const ${T}* bias, const long bias_off,
    __global const ${T}* residual, const long residual_off)
{
% if SHIFT:
    const int qb = min((int)get_global_id(0) * ${QW}, WO - ${QW}), p0 = min((int)get_global_id(1) * ${ROWS}, HO - ${ROWS});
% else:
    const int qb = get_global_id(0) * ${QW}, p0 = get_global_id(1) * ${ROWS};
% endif
    const int blocks = CO / ${KB};
    const int n = get_global_id(2) / blocks, k0 = (get_global_id(2) - n * blocks) * ${KB};
    const int xq = ${STRIDE} * qb;
% if TAIL:
    const int full = xq + ${STRIDE * QW} <= W_IN;
% endif
    /* one named accumulator per channel: an array indexed by a loop variable lived on the stack */
    ${VT} ${', '.join('acc%d = 0' % kk for kk in range(KB))};
    for (int c = 0; c < CI; ++c) {
        __global const ${T}* xc = X + x_off + ((long)n * CI + c) * H_IN * W_IN;
        for (int r = 0; r < R; ++r) {
            const int h0 = ${STRIDE} * p0 + r - PH;
${load_rows('xc', 'h0', 'W_IN', 'full', T, QW, ROWS, S, PW, TAIL, STRIDE)}
            /* the KB·S weights of this step, side by side (conv_blocked_pack) */
            __global const ${T}* wk = Wp + wp_off + (((long)(k0 / ${KB}) * CI + c) * R + r) * ${S * KB};
% for kk in range(KB):
% for s in range(S):
            acc${kk} = (${VT})(wk[${s * KB + kk}]) * xs${s} + acc${kk};
% endfor
% endfor
        }
    }
% for kk in range(KB):
    {
% if BIAS:
        ${VT} out = acc${kk} + (${VT})(bias[bias_off + k0 + ${kk}]);
% else:
        ${VT} out = acc${kk};
% endif
% if RESIDUAL:
        {
            __global const ${T}* res = residual + residual_off + (((long)n * CO + k0 + ${kk}) * HO + p0) * WO + qb;
% if TAIL and not SHIFT:
            /* lanes past the output's edges read nothing (and are not stored) */
            out += (${VT})(${', '.join('(p0 + %d < HO && qb + %d < WO ? res[%d * WO + %d] : (%s)0)' % (j, l, j, l, T) for j in range(ROWS) for l in range(QW))});
% else:
            out += (${VT})(${', '.join('res[%d * WO + %d]' % (j, l) for j in range(ROWS) for l in range(QW))});
% endif
        }
% endif
        ${apply_activation(ACT, "out", VT)}
% for j in range(ROWS):
% if TAIL and not SHIFT:
        if (p0 + ${j} < HO) {
% else:
        {
% endif
            __global ${T}* dst = Y + y_off + (((long)n * CO + k0 + ${kk}) * HO + p0 + ${j}) * WO + qb;
% for l in range(QW):
% if TAIL and not SHIFT:
            if (qb + ${l} < WO) dst[${l}] = out.s${'%x' % (j * QW + l)};
% else:
            dst[${l}] = out.s${'%x' % (j * QW + l)};
% endif
% endfor
        }
% endfor
    }
% endfor
}
% elif MODE == 'pack':
__kernel void conv_blocked_pack(
    __global const ${T}* W, const long w_off,
    __global ${T}* Wp, const long wp_off,
    const int CO, const int CI, const int R)
{
    /* a work-item writes the KB weights of one (channel block, ci, r, s) side by side; its neighbours
       read the same KB rows at the next positions */
    const long unit = get_global_id(0);
    if (unit >= (long)(CO / ${KB}) * CI * R * ${S}) return;
    long rest = unit / ${S};
    const int s = unit - rest * ${S};
    const int r = rest % R;
    rest /= R;
    const int ci = rest % CI, co0 = (rest / CI) * ${KB};
    __global ${T}* dst = Wp + wp_off + unit * ${KB};
% for kk in range(KB):
% if FLIP:
    dst[${kk}] = W[w_off + (((long)ci * CO + co0 + ${kk}) * R + (R - 1 - r)) * ${S} + ${S - 1} - s];
% else:
    dst[${kk}] = W[w_off + (((long)(co0 + ${kk}) * CI + ci) * R + r) * ${S} + s];
% endif
% endfor
}
% else:
__kernel __attribute__((reqd_work_group_size(1, 1, 1)))
void conv_blocked_weight(
    __global const ${T}* X, const long x_off,
    __global const ${T}* G, const long g_off,
    __global ${T}* GW, const long gw_off,
    const int N, const int C, const int H_IN, const int W_IN, const int K, const int P, const int Q,
    const int R, const int PH, const int IMAGES)
{
    const int blocks = K / ${KB};
    const int chunk = get_global_id(2) / blocks;
    const int c = get_global_id(0), r = get_global_id(1), k0 = (get_global_id(2) - chunk * blocks) * ${KB};
    const int n_end = ${'(chunk + 1) * IMAGES < N ? (chunk + 1) * IMAGES : N'};
    /* one named accumulator per (channel, column): an array indexed by a loop variable lived on the stack */
    ${VT} ${', '.join('acc%d_%d = 0' % (kk, s) for kk in range(KB) for s in range(S))};
    for (int n = chunk * IMAGES; n < n_end; ++n) {
        __global const ${T}* xc = X + x_off + ((long)n * C + c) * H_IN * W_IN;
        __global const ${T}* gn = G + g_off + ((long)n * K + k0) * P * Q;
% if SHIFT:
        for (int p = 0; p < P; p += ${ROWS}) {
            const int p0 = min(p, P - ${ROWS}), h0 = ${STRIDE} * p0 + r - PH;
            for (int q = 0; q < Q; q += ${QW}) {
                const int qb = min(q, Q - ${QW}), xq = ${STRIDE} * qb;
% if TAIL:
                const int full = xq + ${STRIDE * QW} <= W_IN;
% endif
${load_rows('xc', 'h0', 'W_IN', 'full', T, QW, ROWS, S, PW, TAIL, STRIDE)}
                if (qb == q && p0 == p) {
${weight_steps(False, T, QW, ROWS, S, KB)}
                } else {
                    /* a block shifted back onto the output: the lanes its neighbour counted weigh 0 */
                    const ${VT} keep = (${VT})(${', '.join('(%s)(%d >= p - p0 && %d >= q - qb)' % (T, j, l) for j in range(ROWS) for l in range(QW))});
${weight_steps("keep", T, QW, ROWS, S, KB)}
                }
            }
        }
% else:
        for (int p0 = 0; p0 < P; p0 += ${ROWS}) {
            const int h0 = ${STRIDE} * p0 + r - PH;
            for (int qb = 0; qb < Q; qb += ${QW}) {
                const int xq = ${STRIDE} * qb;
% if TAIL:
                const int full = xq + ${STRIDE * QW} <= W_IN, full_g = qb + ${QW} <= Q;
% endif
${load_rows('xc', 'h0', 'W_IN', 'full', T, QW, ROWS, S, PW, TAIL, STRIDE)}
% if TAIL:
                /* output-gradient lanes past the tensor stay 0, so their input lanes add nothing */
                if (full_g && p0 + ${ROWS} <= P) {
${weight_steps(False, T, QW, ROWS, S, KB)}
                } else {
${weight_steps(True, T, QW, ROWS, S, KB)}
                }
% else:
${weight_steps(False, T, QW, ROWS, S, KB)}
% endif
            }
        }
% endif
    }
% for kk in range(KB):
% for s in range(S):
    GW[gw_off + (((chunk * (long)K + k0 + ${kk}) * C + c) * R + r) * ${S} + ${s}] = ${' + '.join('acc%d_%d.s%x' % (kk, s, l) for l in range(LANES))};
% endfor
% endfor
}
% endif
