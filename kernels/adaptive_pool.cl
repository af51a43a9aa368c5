<%doc>
Adaptive average pooling over NCHW planes (PyTorch's AdaptiveAvgPool2d): output cell (oh, ow) of an
(Ho, Wo) output averages input rows [floor(oh*H/Ho), ceil((oh+1)*H/Ho)) and the columns likewise, so
cells may overlap when H is not a multiple of Ho.

Template parameters (all have defaults):
  T       C element type                                                             (default "float")
  GLOBAL  Ho = Wo = 1: each output is its whole plane's mean, read as one contiguous run (the global
          average pool ending a ResNet), and backward spreads g / (H*W) without index arithmetic
                                                                                     (default False)
  LANES   GLOBAL forward: partial sums kept apart (a vector of them): 2, 4, 8 or 16   (default 8)
Kernels:
  adaptive_avg_forward   one work-item per output element: global (Ho*Wo, N*C)
  adaptive_avg_backward  one work-item per input element, gathering from every cell covering it:
                         global (H*W, N*C); deterministic, no atomics
</%doc>
<%page args="T='float', GLOBAL=False, LANES=8"/>
<%! from netcl.runtime.cl_vectors import vload %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

inline int bin_start(const int o, const int in, const int out) { return (o * in) / out; }
inline int bin_end(const int o, const int in, const int out) { return ((o + 1) * in + out - 1) / out; }

__kernel void adaptive_avg_forward(__global const ${T}* x, const long x_off, __global ${T}* y, const long y_off,
                                   const int planes, const int H, const int W, const int Ho, const int Wo)
{
    const int cell = get_global_id(0);
    const long plane = get_global_id(1);
    if (cell >= Ho * Wo || plane >= planes) return;
    __global const ${T}* xp = x + x_off + plane * H * W;
% if GLOBAL:
    /* LANES independent partial sums: one chain of dependent adds is bound by the add's latency */
    ${T}${LANES} lanes = (${T}${LANES}) 0;
    const int size = H * W;
    int i = 0;
    for (; i + ${LANES} <= size; i += ${LANES}) lanes += ${vload(f"{T}{LANES}", LANES, "xp + i")};
    ${T} acc = ${" + ".join(f"lanes.s{k:x}" for k in range(LANES))};
    for (; i < size; ++i) acc += xp[i];
    y[y_off + plane] = acc / (${T}) size;
% else:
    const int oh = cell / Wo, ow = cell % Wo;
    const int h0 = bin_start(oh, H, Ho), h1 = bin_end(oh, H, Ho);
    const int w0 = bin_start(ow, W, Wo), w1 = bin_end(ow, W, Wo);
    ${T} acc = 0;
    for (int ih = h0; ih < h1; ++ih)
        for (int iw = w0; iw < w1; ++iw) acc += xp[ih * W + iw];
    y[y_off + plane * Ho * Wo + cell] = acc / (${T}) ((h1 - h0) * (w1 - w0));
% endif
}

__kernel void adaptive_avg_backward(__global const ${T}* gy, const long gy_off, __global ${T}* gx, const long gx_off,
                                    const int planes, const int H, const int W, const int Ho, const int Wo)
{
    const int pixel = get_global_id(0);
    const long plane = get_global_id(1);
    if (pixel >= H * W || plane >= planes) return;
% if GLOBAL:
    gx[gx_off + plane * H * W + pixel] = gy[gy_off + plane] / (${T}) (H * W);
% else:
    const int ih = pixel / W, iw = pixel % W;
    /* the cells covering row ih: oh from floor(ih*Ho/H) while bin_start(oh) <= ih */
    const int oh0 = (ih * Ho) / H, ow0 = (iw * Wo) / W;
    __global const ${T}* gp = gy + gy_off + plane * Ho * Wo;
    ${T} acc = 0;
    for (int oh = oh0; oh < Ho && bin_start(oh, H, Ho) <= ih; ++oh) {
        const int h0 = bin_start(oh, H, Ho), h1 = bin_end(oh, H, Ho);
        if (ih >= h1) continue;
        for (int ow = ow0; ow < Wo && bin_start(ow, W, Wo) <= iw; ++ow) {
            const int w0 = bin_start(ow, W, Wo), w1 = bin_end(ow, W, Wo);
            if (iw >= w1) continue;
            acc += gp[oh * Wo + ow] / (${T}) ((h1 - h0) * (w1 - w0));
        }
    }
    gx[gx_off + plane * H * W + pixel] = acc;
% endif
}
