<%doc>
2-D max and average pooling over NCHW planes, forward and backward, with kernel, stride, padding and
dilation: the d-regularly sparse pooling kernel P_{k,d} of Li, Zhao & Wang (dilation d puts d-1 skipped
pixels between taps), stride 1 included.

Layout: input planes (N*C, H, W) and output planes (N*C, Ho, Wo), both contiguous from their offsets.
Output pixel (oh, ow) reads input rows oh*SH - PH + i*DH for i in [0, KH) (columns likewise).

Template parameters (all have defaults):
  T         C element type                                               (default "float")
  KH, KW    kernel height and width (compile-time so the tap loops unroll) (default 2, 2)
  OP        "max" | "avg"                                                (default "max")
  COUNT_PAD avg only: divide by KH*KW (True, PyTorch's count_include_pad) or by the number of taps
            that fall inside the input (False)                          (default True)
  RELU      max only: compute maxpool(relu(x)) = relu(maxpool(x)) in one pass; a window whose max is
            not positive outputs 0 with argmax -1, so backward sends it no gradient, exactly as the
            separate ReLU would                                          (default False)

Kernels:
  pool_forward   one work-item per output element; max writes the winning input index (ih*W + iw,
                 -1 when every tap is padding) to `arg` so backward needs no recomputation.
                 Ties keep the first tap in row-major order; NaN wins (propagates, as in PyTorch).
  pool_backward  one work-item per INPUT element, gathering from every output window that covers it,
                 so the result needs no atomics and does not depend on scheduling (deterministic).
  pool_backward_disjoint  for windows that never overlap (stride >= dilated extent, e.g. 2x2/2): one
                 work-item per output writes its window's taps; 4x fewer work-items and no tap search.
Launch: 3-D global size (width, height, N*C planes) of the output (forward, backward_disjoint) or of
the input (backward), any local size; the width/height tails are guarded.
</%doc>
<%page args="T='float', KH=2, KW=2, OP='max', COUNT_PAD=True, RELU=False"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void pool_forward(
    __global const ${T}* x, const long x_off,
    __global ${T}* y, const long y_off,
    __global int* arg, const long arg_off,
    const int H, const int W, const int Ho, const int Wo,
    const int SH, const int SW, const int PH, const int PW, const int DH, const int DW)
{
    const int ow = get_global_id(0), oh = get_global_id(1);
    const long plane = get_global_id(2);
    if (ow >= Wo || oh >= Ho) return;
    const long o = (plane * Ho + oh) * Wo + ow;
    __global const ${T}* xp = x + x_off + plane * (long) H * W;
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
% if OP == 'max':
    ${T} best = -INFINITY;
    int best_at = -1;
% else:
    ${T} acc = 0;
    int count = 0;
% endif
    for (int i = 0; i < ${KH}; ++i) {
        const int ih = h0 + i * DH;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < ${KW}; ++j) {
            const int iw = w0 + j * DW;
            if (iw < 0 || iw >= W) continue;
            const ${T} v = xp[ih * W + iw];
% if OP == 'max':
            if (best_at < 0 || v > best || (isnan(v) && !isnan(best))) { best = v; best_at = ih * W + iw; }
% else:
            acc += v;
            ++count;
% endif
        }
    }
% if OP == 'max' and RELU:
    const bool positive = best > (${T}) 0 || isnan(best);
    y[y_off + o] = positive ? best : (${T}) 0;
    arg[arg_off + o] = positive ? best_at : -1;
% elif OP == 'max':
    y[y_off + o] = best;
    arg[arg_off + o] = best_at;
% elif COUNT_PAD:
    y[y_off + o] = acc / (${T}) (${KH * KW});
% else:
    y[y_off + o] = count > 0 ? acc / (${T}) count : (${T}) 0;
% endif
}

% if OP == 'avg' and not COUNT_PAD:
/* Taps of window (oh, ow) that land inside the input: the divisor used by forward. */
inline int window_count(const int oh, const int ow, const int H, const int W,
                        const int SH, const int SW, const int PH, const int PW, const int DH, const int DW)
{
    int rows = 0, cols = 0;
    for (int i = 0; i < ${KH}; ++i) { const int ih = oh * SH - PH + i * DH; rows += (ih >= 0 && ih < H); }
    for (int j = 0; j < ${KW}; ++j) { const int iw = ow * SW - PW + j * DW; cols += (iw >= 0 && iw < W); }
    return rows * cols;
}
% endif

__kernel void pool_backward(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo,
    const int SH, const int SW, const int PH, const int PW, const int DH, const int DW)
{
    const int iw = get_global_id(0), ih = get_global_id(1);
    const long plane = get_global_id(2);
    if (iw >= W || ih >= H) return;
    const long e = (plane * H + ih) * W + iw;
    const long out_base = plane * (long) Ho * Wo;
    ${T} acc = 0;
    /* Output row oh uses tap i on this input row when oh*SH - PH + i*DH == ih. */
    for (int i = 0; i < ${KH}; ++i) {
        const int th = ih + PH - i * DH;
        if (th < 0 || th % SH) continue;
        const int oh = th / SH;
        if (oh >= Ho) continue;
        for (int j = 0; j < ${KW}; ++j) {
            const int tw = iw + PW - j * DW;
            if (tw < 0 || tw % SW) continue;
            const int ow = tw / SW;
            if (ow >= Wo) continue;
            const long o = out_base + (long) oh * Wo + ow;
% if OP == 'max':
            if (arg[arg_off + o] == ih * W + iw) acc += gy[gy_off + o];
% elif COUNT_PAD:
            acc += gy[gy_off + o];
% else:
            acc += gy[gy_off + o] / (${T}) window_count(oh, ow, H, W, SH, SW, PH, PW, DH, DW);
% endif
        }
    }
% if OP == 'avg' and COUNT_PAD:
    acc /= (${T}) (${KH * KW});
% endif
    gx[gx_off + e] = acc;
}

/* Backward when windows never overlap (stride >= dilated kernel extent on both axes): each output
   writes every tap of its own window, so each input element is written at most once (deterministic,
   no atomics). Inputs outside every window must be zeroed beforehand by the caller. */
__kernel void pool_backward_disjoint(
    __global const ${T}* gy, const long gy_off,
    __global const int* arg, const long arg_off,
    __global ${T}* gx, const long gx_off,
    const int H, const int W, const int Ho, const int Wo,
    const int SH, const int SW, const int PH, const int PW, const int DH, const int DW)
{
    const int ow = get_global_id(0), oh = get_global_id(1);
    const long plane = get_global_id(2);
    if (ow >= Wo || oh >= Ho) return;
    const long o = (plane * Ho + oh) * Wo + ow;
    __global ${T}* gp = gx + gx_off + plane * (long) H * W;
    const int h0 = oh * SH - PH, w0 = ow * SW - PW;
% if OP == 'max':
    const ${T} g = gy[gy_off + o];
    const int at = arg[arg_off + o];
% elif COUNT_PAD:
    const ${T} g = gy[gy_off + o] / (${T}) (${KH * KW});
% else:
    const ${T} g = gy[gy_off + o] / (${T}) window_count(oh, ow, H, W, SH, SW, PH, PW, DH, DW);
% endif
    for (int i = 0; i < ${KH}; ++i) {
        const int ih = h0 + i * DH;
        if (ih < 0 || ih >= H) continue;
        for (int j = 0; j < ${KW}; ++j) {
            const int iw = w0 + j * DW;
            if (iw < 0 || iw >= W) continue;
% if OP == 'max':
            gp[ih * W + iw] = (ih * W + iw == at) ? g : (${T}) 0;
% else:
            gp[ih * W + iw] = g;
% endif
        }
    }
}
