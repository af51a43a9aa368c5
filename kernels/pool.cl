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
  RELU       max only: compute maxpool(relu(x)) = relu(maxpool(x)) in one pass; a window whose max is
             not positive outputs 0 with argmax -1, so backward sends it no gradient, exactly as the
             separate ReLU would                                         (default False)

Kernels (one work-item per row; it walks the row's pixels, so neighbouring taps are cache neighbours):
  pool_forward            global (Ho, N*C). Max writes the winning input index ih*W + iw (-1 when every
                          tap is padding) to `arg` for backward. Ties keep the first tap in row-major
                          order; a NaN anywhere in the window makes the output NaN (as in PyTorch; its
                          gradient goes to the largest other tap: tracking the NaN's position in the
                          select chain cost PoCL its vectorization, 4x).
  pool_backward_disjoint  global (Ho, N*C), for windows that never overlap (stride >= dilated extent):
                          each output writes every tap of its own window, so each input element is
                          written at most once (the caller zeroes the input gradient first when the
                          windows do not cover it).
  pool_backward           global (H, N*C), for overlapping windows: each input element gathers from
                          every window that covers it.
Both backward kernels are deterministic (no atomics). Row tails are guarded.
</%doc>
<%page args="T='float', KH=2, KW=2, SH=2, SW=2, PH=0, PW=0, PH_END=None, PW_END=None, CEIL=False, DH=1, DW=1, OP='max', COUNT_PAD=True, RELU=False"/>
<%! from netcl.runtime.cl_guards import beyond %>
<%
    PH_END = PH if PH_END is None else PH_END
    PW_END = PW if PW_END is None else PW_END
    PADDED = PH > 0 or PW > 0 or PH_END > 0 or PW_END > 0 or CEIL
    CLIPPED_DIVISOR = CEIL and COUNT_PAD
    UNROLL = KH * KW <= 64
    AREA = KH * KW
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
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

__kernel void pool_forward(
    __global const ${T}* x, const long x_off,
    __global ${T}* y, const long y_off,
    __global int* arg, const long arg_off,
    const int H, const int W, const int Ho, const int Wo)
{
    const int oh = get_global_id(0);
    const long plane = get_global_id(1);
    if (${beyond('oh', 'Ho')}) return;
    __global const ${T}* xp = x + x_off + plane * H * W;
    __global ${T}* yo = y + y_off + (plane * Ho + oh) * Wo;
    __global int* ao = arg + arg_off + (plane * Ho + oh) * Wo;
    const int h0 = oh * ${SH} - ${PH};
    for (int ow = 0; ow < Wo; ++ow) {
        const int w0 = ow * ${SW} - ${PW};
% if OP == 'max':
        ${T} best = -INFINITY;
        int at = -1, nan = 0;
        ${taps(max_tap)}
        best = nan ? (${T}) NAN : best;
  % if RELU:
        const int positive = !(best <= (${T}) 0);  /* NaN stays NaN, as relu(NaN) */
        yo[ow] = positive ? best : (${T}) 0;
        ao[ow] = positive ? at : -1;
  % else:
        yo[ow] = best;
        ao[ow] = at;
  % endif
% else:
        ${T} acc = 0;
        int count = 0;
        ${taps(avg_tap)}
  % if CLIPPED_DIVISOR or COUNT_PAD or not PADDED:
        yo[ow] = acc / ${divisor('oh', 'ow')};
  % else:
        yo[ow] = count > 0 ? acc / (${T}) count : (${T}) 0;
  % endif
% endif
    }
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

__kernel void pool_backward(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo)
{
    const int ih = get_global_id(0);
    const long plane = get_global_id(1);
    if (${beyond('ih', 'H')}) return;
    const long out_base = plane * Ho * Wo;
    const long row = (plane * H + ih) * W;
    for (int iw = 0; iw < W; ++iw) {
        const int here = ih * W + iw;
        ${T} acc = 0;
        ${taps(gather_tap)}
        gx[gx_off + row + iw] = acc;
    }
}
