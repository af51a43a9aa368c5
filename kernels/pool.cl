<%doc>
2-D max and average pooling over NCHW planes, forward and backward, with kernel, stride, padding and
dilation: the d-regularly sparse pooling kernel P_{k,d} of Li, Zhao & Wang (dilation d puts d-1 skipped
pixels between taps), stride 1 included.

Layout: input planes (N*C, H, W) and output planes (N*C, Ho, Wo), both contiguous from their offsets.
Output pixel (oh, ow) reads input pixels (oh*SH - PH + i*DH, ow*SW - PW + j*DW), i < KH, j < KW; the
padded input spans rows [-PH, H + PH_END) and columns [-PW, W + PW_END).

Template parameters (all have defaults). The geometry is compile-time: with constant strides and the
taps unrolled, PoCL's CPU code is branch-free selects (a data-dependent branch per tap made these kernels
over ten times slower there).
  T          C element type                                             (default "float")
  KH, KW     kernel height and width                                    (default 2, 2)
  SH, SW     strides                                                    (default 2, 2)
  PH, PW     zero/-inf padding before the first row and column             (default 0, 0)
  PH_END, PW_END  padding after the last row and column (ONNX's asymmetric pads; only average pooling's
             divisor with CEIL and COUNT_PAD reads them)                (default None: PH, PW)
  CEIL       output sizes were rounded up (ceil_mode): the last window may reach past the padded input,
             so every tap is bounds-checked and COUNT_PAD divides by the taps inside the padded input
                                                                        (default False)
  DH, DW     dilations                                                  (default 1, 1)
  OP         "max" | "avg"                                              (default "max")
  COUNT_PAD  avg only: divide by KH*KW (True, PyTorch's count_include_pad) or by the number of taps
             inside the input (False)                                   (default True)
  VW         outputs (forward) or input cells (backward) per work-item of the block kernels: 4 or 8
                                                                        (default 8)
  RELU       max only: compute maxpool(relu(x)) = relu(maxpool(x)) in one pass; a window whose max is
             not positive outputs 0 with argmax -1, so backward sends it no gradient, exactly as the
             separate ReLU would                                         (default False)
  ARGMAX     max only: write the argmax for backward; False (inference, where no backward follows)
             leaves `arg` untouched and spares the index bookkeeping      (default True)

Kernels. A row of outputs splits into interior columns, whose windows lie inside the input's columns,
and edge columns. A block kernel's work-item computes VW neighbouring interior outputs of one row with
vector loads and selects (the taps of VW outputs at stride SW are every SW-th element of one span of the
input row, so a load per tap serves them all; a work-item per output instead made CPU drivers gather
every tap lane by lane). Rows outside the input are clamped to a valid row and masked, which keeps the
loads contiguous. The last block of a row shifts left to end at the last interior column and stores only
the outputs the block before it did not; the first and last block of a row also compute the row's edge
columns one by one with every tap bounds-checked. Rows too narrow for one block go to the edge kernels,
one element a work-item, every tap bounds-checked.
  pool_forward_blocks     global (blocks, Ho, N*C) over the interior columns [c0, c0 + n_cols), n_cols >= VW.
                          Max writes the winning input index ih*W + iw (-1 when every tap is padding) to
                          `arg` for backward. Ties keep the first tap in row-major order; a NaN anywhere in
                          the window makes the output NaN (as in PyTorch; its gradient goes to the largest
                          other tap: tracking the NaN's position in the select chain cost PoCL its
                          vectorization).
  pool_forward_edges      global (Ho*Wo, N*C): every output of a narrow image.
  pool_backward_blocks    global (blocks, H, N*C). Input column iw = m*SW + r lies in the cell m, residue r;
                          the windows that can cover any column of cell m are m + d for d in a compile-time
                          range (at most ceil(extent / SW) + 1 of them), and whether window m + d covers
                          residue r is compile-time too. Each input element gathers from those windows
                          only: max adds the gradient of each whose saved argmax is this element, avg adds
                          every covering window's share (a constant divisor only: COUNT_PAD without CEIL,
                          or no padding). The cells [m0, m0 + n_cells) have every candidate window inside
                          the output and every column inside the input; n_cells >= VW.
  pool_backward_edges     global (H*W, N*C): every input element of a narrow image (or of an average pool
                          whose divisor varies), gathering from every window that can cover it.
  pool_backward_disjoint  global (Ho, N*C), for windows that never overlap (stride >= dilated extent, as
                          LeNet's and VGG's 2x2/2): a work-item walks one output row and writes every tap of
                          each window, so each input element is written at most once (the caller zeroes the
                          input gradient first when the windows do not tile the input). A row of outputs
                          per work-item keeps its loads and stores contiguous where a row is too narrow for
                          the block kernels.
Every kernel writes each of its elements at most once: backward is deterministic (no atomics).
</%doc>
<%page args="T='float', KH=2, KW=2, SH=2, SW=2, PH=0, PW=0, PH_END=None, PW_END=None, CEIL=False, DH=1, DW=1, OP='max', COUNT_PAD=True, RELU=False, VW=8, ARGMAX=True"/>
<%!
from netcl.runtime.cl_guards import beyond
from netcl.runtime.cl_vectors import even_odd_definition
%>
<%
    PH_END = PH if PH_END is None else PH_END
    PW_END = PW if PW_END is None else PW_END
    PADDED = PH > 0 or PW > 0 or PH_END > 0 or PW_END > 0 or CEIL
    CLIPPED_DIVISOR = CEIL and COUNT_PAD
    UNROLL = KH * KW <= 64
    AREA = KH * KW
    E_H, E_W = DH * (KH - 1), DW * (KW - 1)
    ROW_PADDED = PH > 0 or PH_END > 0 or CEIL
    # the vector types of the block kernels: values, and the integers their comparisons give
    VT = f"{T}{VW}"
    IN = "long" if T == "double" else "int"
    IT = f"{IN}{VW}"
    HEX = "0123456789ABCDEF"
    LANES = "(" + ", ".join(str(k * SW) for k in range(VW)) + ")"
    # backward: window m + d may cover column m*SW + r of cell m for d in [D_MIN_W, D_MAX_W]
    D_MIN_H, D_MAX_H = -((E_H - PH) // SH), (SH - 1 + PH) // SH
    D_MIN_W, D_MAX_W = -((E_W - PW) // SW), (SW - 1 + PW) // SW
    def covers(r, d, s, p, e, dil):
        t = r + p - d * s
        return 0 <= t <= e and t % dil == 0
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

% if SW == 2:
/* A stride-2 block's tap: the even lanes of `low` then the odd lanes of `high` */
${even_odd_definition(VT, VW)}
% endif

## Emit `body(i, j)` for every tap: literally unrolled for small kernels, else as two loops.
<%def name="taps(body)">
% if UNROLL:
  % for i in range(KH):
    % for j in range(KW):
        { ${body(str(i), str(j), i == 0 and j == 0)} }
    % endfor
  % endfor
% else:
        { ${body('0', '0', True)} }
        for (int t = 1; t < ${AREA}; ++t) {
            const int i = t / ${KW}, j = t % ${KW};
            ${body('i', 'j', False)}
        }
% endif
</%def>

<%def name="max_tap(i, j, first)">
            const int ih = h0 + ${i} * ${DH}, iw = w0 + ${j} * ${DW};
  % if first and not PADDED:
            at = ih * W + iw;
            best = xp[at];
            nan = best != best;
  % elif PADDED:
            const int ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W);
            const int idx = ok ? ih * W + iw : 0;
            const ${T} v = xp[idx];
            const int take = ok & ((v > best) | (at < 0));
            nan |= ok & (v != v);
  % else:
            const int idx = ih * W + iw;
            const ${T} v = xp[idx];
            const int take = v > best;
            nan |= v != v;
  % endif
  % if PADDED or not first:
            best = take ? v : best;
            at = take ? idx : at;
  % endif
</%def>

<%def name="avg_tap(i, j, first)">
            const int ih = h0 + ${i} * ${DH}, iw = w0 + ${j} * ${DW};
  % if PADDED:
            const int ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W);
            acc += ok ? xp[ok ? ih * W + iw : 0] : (${T}) 0;
            count += ok;
  % else:
            acc += xp[ih * W + iw];
  % endif
</%def>

/* The divisor of window (oh, ow) for average pooling. */
<%def name="divisor(oh, ow)">
% if CLIPPED_DIVISOR:
(${T}) (window_rows(${oh}, -${PH}, H + ${PH_END}) * window_cols(${ow}, -${PW}, W + ${PW_END}))
% elif COUNT_PAD or not PADDED:
(${T}) ${AREA}
% else:
(${T}) (window_rows(${oh}, 0, H) * window_cols(${ow}, 0, W))
% endif
</%def>

% if OP == 'avg' and PADDED and (CLIPPED_DIVISOR or not COUNT_PAD):
/* The taps of window row oh (column ow) inside [lo, hi). */
inline int window_rows(const int oh, const int lo, const int hi) {
    int n = 0;
    for (int i = 0; i < ${KH}; ++i) { const int ih = oh * ${SH} - ${PH} + i * ${DH}; n += (ih >= lo) & (ih < hi); }
    return n;
}
inline int window_cols(const int ow, const int lo, const int hi) {
    int n = 0;
    for (int j = 0; j < ${KW}; ++j) { const int iw = ow * ${SW} - ${PW} + j * ${DW}; n += (iw >= lo) & (iw < hi); }
    return n;
}
% endif

/* VW values p[0], p[SW], ..., p[(VW-1)*SW]: one vector load, or at stride 2 two overlapping ones, each
   read only where the taps are (a 2*VW load would read one element past the last tap). */
<%def name="strided(p)">\
% if SW == 1:
vload${VW}(0, ${p})\
% elif SW == 2:
even_odd(vload${VW}(0, ${p}), vload${VW}(0, ${p} + ${VW - 1}))\
% else:
(${VT}) (${', '.join(f'({p})[{k * SW}]' for k in range(VW))})\
% endif
</%def>

/* Store VW values `v` (type `vec`) to p[0..VW): whole, or (the shifted last block of a row) only the
   lanes from `skip` on. */
<%def name="store_lanes(p, v, vec)">\
    if (skip == 0) {
        vstore${VW}(${v}, 0, ${p});
    } else {
        const ${vec} lanes = ${v};
  % for k in range(1, VW):
        if (${k} >= skip) (${p})[${k}] = lanes.s${HEX[k]};
  % endfor
    }
</%def>

/* Output (oh, ow) with every tap bounds-checked: the edge columns. */
inline void forward_one(__global const ${T}* xp, __global ${T}* y, __global int* arg, const long out_at,
                        const int H, const int W, const int oh, const int ow)
{
    const int h0 = oh * ${SH} - ${PH};
    const int w0 = ow * ${SW} - ${PW};
% if OP == 'max':
    ${T} best = -INFINITY;
    int at = -1, nan = 0;
    ${taps(max_tap)}
    best = nan ? (${T}) NAN : best;
  % if RELU:
    const int positive = !(best <= (${T}) 0);  /* NaN stays NaN, as relu(NaN) */
    y[out_at] = positive ? best : (${T}) 0;
    % if ARGMAX:
    arg[out_at] = positive ? at : -1;
    % endif
  % else:
    y[out_at] = best;
    % if ARGMAX:
    arg[out_at] = at;
    % endif
  % endif
% else:
    ${T} acc = 0;
    int count = 0;
    ${taps(avg_tap)}
  % if CLIPPED_DIVISOR or COUNT_PAD or not PADDED:
    y[out_at] = acc / ${divisor('oh', 'ow')};
  % else:
    y[out_at] = count > 0 ? acc / (${T}) count : (${T}) 0;
  % endif
% endif
}

__kernel void pool_forward_edges(
    __global const ${T}* x, const long x_off,
    __global ${T}* y, const long y_off,
    __global int* arg, const long arg_off,
    const int H, const int W, const int Ho, const int Wo)
{
    const int e = get_global_id(0);
    const long plane = get_global_id(1);
    if (${beyond('e', 'Ho * Wo')}) return;
    const int oh = e / Wo, ow = e - oh * Wo;
    forward_one(x + x_off + plane * H * W, y + y_off, arg + arg_off, (plane * Ho + oh) * Wo + ow, H, W, oh, ow);
}

/* The ids of a block kernel's work-item: block `block` of row `row` of `plane`, the block's first lane
   `start` among the `count` of the row (the last block shifted left to end at the row's last one) and the
   lanes `skip` that the block before it covers. */
<%def name="block_ids(row, rows, count)">\
    const int block = get_global_id(0);
    const int ${row} = get_global_id(1);
    const long plane = get_global_id(2);
    if (${beyond('block', f'({count} + {VW - 1}) / {VW}')} || ${beyond(row, rows, 1)}) return;
    const int first = block * ${VW};
    const int start = min(first, ${count} - ${VW});
    const int skip = first - start;
</%def>

__kernel void pool_forward_blocks(
    __global const ${T}* x, const long x_off,
    __global ${T}* y, const long y_off,
    __global int* arg, const long arg_off,
    const int H, const int W, const int Ho, const int Wo, const int c0, const int n_cols)
{
${block_ids('oh', 'Ho', 'n_cols')}    const int ow = c0 + start;
    __global const ${T}* xp = x + x_off + plane * H * W;
    const long out_at = (plane * Ho + oh) * Wo + ow;
    if (block == 0)
        for (int col = 0; col < c0; ++col)
            forward_one(xp, y + y_off, arg + arg_off, out_at - ow + col, H, W, oh, col);
    if (first + ${VW} >= n_cols)
        for (int col = c0 + n_cols; col < Wo; ++col)
            forward_one(xp, y + y_off, arg + arg_off, out_at - ow + col, H, W, oh, col);
    const int h0 = oh * ${SH} - ${PH};
    const int w0 = ow * ${SW} - ${PW};
% if OP == 'max':
    ${VT} best = (${VT}) -INFINITY;
  % if ARGMAX:
    ${IT} rel = (${IT}) -1;
  % endif
    ${IT} nan = (${IT}) 0;
% else:
    ${VT} acc = (${VT}) 0;
% endif
% for i in range(KH):
    {
        const int ih = h0 + ${i * DH};
  % if ROW_PADDED:
        /* a row outside the input: load a valid one, mask it out */
        const int row_ok = (ih >= 0) & (ih < H);
        const ${IT} ok = (${IT}) -row_ok;
        __global const ${T}* row = xp + (row_ok ? ih : 0) * W + w0;
  % else:
        const ${IT} ok = (${IT}) -1;
        __global const ${T}* row = xp + ih * W + w0;
  % endif
  % for j in range(KW):
        {
            const ${VT} v = ${strided(f"row + {j * DW}")};
    % if OP == 'max':
      % if ARGMAX:
            const ${IT} take = ok & ((v > best) | (rel < 0));
            nan |= ok & (v != v);
            best = select(best, v, take);
            rel = select(rel, (${IT}) (${i * DH} * W + ${j * DW}), take);
      % else:
            /* no argmax to keep: a tap equal to the best so far changes nothing */
            nan |= ok & (v != v);
            best = select(best, v, ok & (v > best));
      % endif
    % else:
            acc += select((${VT}) 0, v, ok);
    % endif
        }
  % endfor
    }
% endfor
% if OP == 'max':
  % if ARGMAX:
    ${IT} at = select((${IT}) (h0 * W + w0) + (${IT}) ${LANES} + rel, (${IT}) -1, rel < 0);
  % endif
    best = select(best, (${VT}) NAN, nan);
  % if RELU:
    const ${IT} off = best <= (${VT}) 0;  /* NaN stays NaN, as relu(NaN) */
    best = select(best, (${VT}) 0, off);
    % if ARGMAX:
    at = select(at, (${IT}) -1, off);
    % endif
  % endif
${store_lanes("y + y_off + out_at", "best", VT)}
  % if ARGMAX:
${store_lanes("arg + arg_off + out_at", f"convert_int{VW}(at)", f"int{VW}")}
  % endif
% else:
  % if CLIPPED_DIVISOR or COUNT_PAD or not PADDED:
    const ${VT} out = acc / ${divisor('oh', 'ow')};
  % else:
    const ${T} taps_inside = ${divisor('oh', 'ow')};
    const ${VT} out = taps_inside > 0 ? acc / taps_inside : (${VT}) 0;
  % endif
${store_lanes("y + y_off + out_at", "out", VT)}
% endif
}

<%def name="gather_tap(i, j, first)">
            const int th = ih + ${PH} - ${i} * ${DH}, tw = iw + ${PW} - ${j} * ${DW};
  % if SH == 1 and SW == 1:
            const int oh = th, ow = tw;
            const int ok = (th >= 0) & (oh < Ho) & (tw >= 0) & (ow < Wo);
  % else:
            const int oh = th / ${SH}, ow = tw / ${SW};
            const int ok = (th >= 0) & (th % ${SH} == 0) & (oh < Ho) & (tw >= 0) & (tw % ${SW} == 0) & (ow < Wo);
  % endif
            /* o is valid even when !ok, so the loads are unconditional and the sum is selects */
            const long o = out_base + (ok ? oh * Wo + ow : 0);
            const ${T} g = gy[gy_off + o];
  % if OP == 'max':
            acc += (ok & (arg[arg_off + o] == here)) ? g : (${T}) 0;
  % else:
            acc += ok ? g / ${divisor('oh', 'ow')} : (${T}) 0;
  % endif
</%def>

/* The gradient of input element (ih, iw), gathered from every window that can cover it: the edge
   columns. */
inline ${T} gather_one(__global const ${T}* gy, __global const int* arg, const long out_base,
                       const int H, const int W, const int Ho, const int Wo, const int ih, const int iw)
{
    const int here = ih * W + iw;
    const long gy_off = 0, arg_off = 0;
    ${T} acc = 0;
    ${taps(gather_tap)}
    return acc;
}

__kernel void pool_backward_blocks(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo, const int m0, const int n_cells)
{
${block_ids('ih', 'H', 'n_cells')}    const int m = m0 + start;
    const int q = ih / ${SH}, rh = ih - q * ${SH};
    const long out_plane = plane * Ho * Wo;
% for r in range(SW):
    ${VT} acc${r} = (${VT}) 0;
  % if OP == 'max':
    const ${IT} here${r} = (${IT}) (ih * W + m * ${SW} + ${r}) + (${IT}) ${LANES};
  % endif
% endfor
% for dh in range(D_MIN_H, D_MAX_H + 1):
    {
        const int oh = q + ${dh}, th = rh + ${PH - dh * SH};
        const int row_ok = (oh >= 0) & (oh < Ho) & (th >= 0) & (th <= ${E_H})${f' & (th % {DH} == 0)' if DH > 1 else ''};
        const ${IT} ok = (${IT}) -row_ok;
        /* a window row outside the output: load a valid one, mask it out */
        const long o = out_plane + (long) (row_ok ? oh : 0) * Wo + m;
  % for d in range(D_MIN_W, D_MAX_W + 1):
    % if any(covers(r, d, SW, PW, E_W, DW) for r in range(SW)):
        {
            const ${VT} g = vload${VW}(0, gy + gy_off + o + ${d});
      % if OP == 'max':
            const ${IT} a = convert_${IT}(vload${VW}(0, arg + arg_off + o + ${d}));
        % for r in range(SW):
          % if covers(r, d, SW, PW, E_W, DW):
            acc${r} += select((${VT}) 0, g, ok & (a == here${r}));
          % endif
        % endfor
      % else:
            const ${VT} share = select((${VT}) 0, g, ok);
        % for r in range(SW):
          % if covers(r, d, SW, PW, E_W, DW):
            acc${r} += share;
          % endif
        % endfor
      % endif
        }
    % endif
  % endfor
    }
% endfor
    __global ${T}* gx_row = gx + gx_off + (plane * H + ih) * W;
    if (block == 0)
        for (int col = 0; col < m0 * ${SW}; ++col)
            gx_row[col] = gather_one(gy + gy_off, arg + arg_off, out_plane, H, W, Ho, Wo, ih, col);
    if (first + ${VW} >= n_cells)
        for (int col = (m0 + n_cells) * ${SW}; col < W; ++col)
            gx_row[col] = gather_one(gy + gy_off, arg + arg_off, out_plane, H, W, Ho, Wo, ih, col);
    __global ${T}* out = gx_row + m * ${SW};
% if OP == 'avg':
  % for r in range(SW):
    acc${r} /= (${T}) ${AREA};
  % endfor
% endif
% if SW == 1:
${store_lanes("out", "acc0", VT)}
% elif SW == 2:
    /* interleaved as two VW-lane halves (no 2*VW-lane vectors: LLVM 14 cannot scalarize 16 lanes), lanes
       named as in even_odd */
    const ${VT} low = (${VT}) (${', '.join(f'acc0.s{HEX[k]}, acc1.s{HEX[k]}' for k in range(VW // 2))});
    const ${VT} high = (${VT}) (${', '.join(f'acc0.s{HEX[k]}, acc1.s{HEX[k]}' for k in range(VW // 2, VW))});
    if (skip == 0) {
        vstore${VW}(low, 0, out);
        vstore${VW}(high, 0, out + ${VW});
    } else {
  % for k in range(1, VW):
        if (${k} >= skip) { out[${2 * k}] = ${'low' if 2 * k < VW else 'high'}.s${HEX[(2 * k) % VW]}; out[${2 * k + 1}] = ${'low' if 2 * k < VW else 'high'}.s${HEX[(2 * k + 1) % VW]}; }
  % endfor
    }
% else:
  % for k in range(VW):
    if (${k} >= skip) {
    % for r in range(SW):
        out[${k * SW + r}] = acc${r}.s${HEX[k]};
    % endfor
    }
  % endfor
% endif
}

<%def name="scatter_tap(i, j, first)">
            const int ih = h0 + ${i} * ${DH}, iw = w0 + ${j} * ${DW};
  % if PADDED:
            if ((ih >= 0) & (ih < H) & (iw >= 0) & (iw < W))
  % endif
  % if OP == 'max':
            gp[ih * W + iw] = (ih * W + iw == at) ? g : (${T}) 0;
  % else:
            gp[ih * W + iw] = g;
  % endif
</%def>

__kernel void pool_backward_disjoint(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo)
{
    const int oh = get_global_id(0);
    const long plane = get_global_id(1);
    if (${beyond('oh', 'Ho')}) return;
    __global ${T}* gp = gx + gx_off + plane * H * W;
    __global const ${T}* go = gy + gy_off + (plane * Ho + oh) * Wo;
    __global const int* ao = arg + arg_off + (plane * Ho + oh) * Wo;
    const int h0 = oh * ${SH} - ${PH};
    for (int ow = 0; ow < Wo; ++ow) {
        const int w0 = ow * ${SW} - ${PW};
% if OP == 'max':
        const ${T} g = go[ow];
        const int at = ao[ow];
% else:
        const ${T} g = go[ow] / ${divisor('oh', 'ow')};
% endif
        ${taps(scatter_tap)}
    }
}

__kernel void pool_backward_edges(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo)
{
    const int e = get_global_id(0);
    const long plane = get_global_id(1);
    if (${beyond('e', 'H * W')}) return;
    const int ih = e / W, iw = e - ih * W;
    gx[gx_off + plane * H * W + e] = gather_one(gy + gy_off, arg + arg_off, plane * Ho * Wo, H, W, Ho, Wo, ih, iw);
}
