<%doc>
Activations that the elementwise family does not cover, each with its backward, plus the residual
add + ReLU and softmax / log-softmax along one axis. Every tensor is contiguous from its offset.

Template parameters (all have defaults):
  T      C element type                                                        (default "float")
  ACT    act_forward / act_backward's function, with the runtime scalars p0, p1 (default "leaky_relu"):
           "leaky_relu"  y = x > 0 ? x : p0 * x               (p0 the negative slope; PyTorch: the slope's
                                                               side, x <= 0, gets p0 * g)
           "gelu"        y = x/2 (1 + erf(x / sqrt 2))        (exact, PyTorch's default)
           "gelu_tanh"   y = x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
         both computed without the cancellation of 1 + erf / 1 + tanh for negative x: as
         x/2 erfc(-x / sqrt 2) and x / (1 + exp(-2u)), u the tanh's argument
           "hardtanh"    y = min(max(x, p0), p1)              (ReLU6: p0 = 0, p1 = 6); gradient g strictly
                                                               inside (p0, p1), 0 from each bound on
           "hardswish"   y = x min(max(x + 3, 0), 6) / 6      gradient 0 up to -3, g (x/3 + 1/2) strictly
                                                               inside (-3, 3), g from 3 on
           "hardsigmoid" y = min(max(x + 3, 0), 6) / 6        gradient g/6 strictly inside (-3, 3), else 0
           "silu"        y = x / (1 + exp(-x))                gradient g s (1 + x (1 - s)), s = sigmoid(x)
         The gradients at the kinks are PyTorch's (hardtanh_backward, hardswish_backward,
         hardsigmoid_backward), and NaN passes through every forward.
  LOG    softmax_forward / softmax_backward compute log-softmax instead       (default False)

Kernels:
  act_forward      y = f(x), one work-item per element (n elements)
  act_backward     gx = g * f'(x) (from the input x)
  add_relu         y = max(a + b, 0): a residual connection's sum and its ReLU in one pass
  relu_backward    gx = y > 0 ? g : 0 (the gradient of add_relu for both of its inputs; y is its output)
  softmax_forward  x viewed as (outer, D, inner) with the softmax over D: one work-item per (outer, inner)
                   row, global (inner, outer); three passes over the row (max, sum of exp around the max,
                   write), so large logits never overflow
  softmax_backward softmax: gx = y (g - sum_d g y);  log-softmax: gx = g - exp(y) sum_d g
</%doc>
<%page args="T='float', ACT='leaky_relu', LOG=False"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
#define SQRT_HALF ((${T}) 0.70710678118654752440)
#define INV_SQRT_2PI ((${T}) 0.39894228040143267794)
#define SQRT_2_OVER_PI ((${T}) 0.79788456080286535588)
#define GELU_CUBIC ((${T}) 0.044715)

/* min(max(v, lo), hi) with comparisons, not fmin/fmax: those return the number for a NaN operand, and a
   NaN must pass through as it does in PyTorch */
inline ${T} clamp_keep_nan(const ${T} v, const ${T} lo, const ${T} hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* relu6(v + 3) / 6: Hardsigmoid, and Hardswish's gate */
inline ${T} hard_gate(const ${T} v)
{
    return clamp_keep_nan(v + (${T}) 3, (${T}) 0, (${T}) 6) / (${T}) 6;
}

__kernel void act_forward(__global const ${T}* x, const long x_off, __global ${T}* y, const long y_off,
                          const long n, const ${T} p0, const ${T} p1)
{
    const long e = get_global_id(0);
    if (${beyond('e', 'n')}) return;
    const ${T} v = x[x_off + e];
% if ACT == 'leaky_relu':
    y[y_off + e] = v > (${T}) 0 ? v : p0 * v;
% elif ACT == 'hardtanh':
    y[y_off + e] = clamp_keep_nan(v, p0, p1);
% elif ACT == 'hardswish':
    y[y_off + e] = v * hard_gate(v);
% elif ACT == 'hardsigmoid':
    y[y_off + e] = hard_gate(v);
% elif ACT == 'silu':
    y[y_off + e] = v / ((${T}) 1 + exp(-v));
% elif ACT == 'gelu':
    y[y_off + e] = (${T}) 0.5 * v * erfc(-v * SQRT_HALF);
% elif ACT == 'gelu_tanh':
    y[y_off + e] = v / ((${T}) 1 + exp((${T}) -2 * SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)));
% endif
}

__kernel void act_backward(__global const ${T}* x, const long x_off, __global const ${T}* g, const long g_off,
                           __global ${T}* gx, const long gx_off, const long n, const ${T} p0, const ${T} p1)
{
    const long e = get_global_id(0);
    if (${beyond('e', 'n')}) return;
    const ${T} v = x[x_off + e], d = g[g_off + e];
% if ACT == 'leaky_relu':
    gx[gx_off + e] = v > (${T}) 0 ? d : p0 * d;
% elif ACT == 'hardtanh':
    gx[gx_off + e] = (v <= p0 || v >= p1) ? (${T}) 0 : d;
% elif ACT == 'hardswish':
    gx[gx_off + e] = v <= (${T}) -3 ? (${T}) 0 : (v < (${T}) 3 ? d * (v / (${T}) 3 + (${T}) 0.5) : d);
% elif ACT == 'hardsigmoid':
    gx[gx_off + e] = (v > (${T}) -3 && v < (${T}) 3) ? d / (${T}) 6 : (${T}) 0;
% elif ACT == 'silu':
    const ${T} s = (${T}) 1 / ((${T}) 1 + exp(-v));
    gx[gx_off + e] = d * s * ((${T}) 1 + v * ((${T}) 1 - s));
% elif ACT == 'gelu':
    const ${T} cdf = (${T}) 0.5 * erfc(-v * SQRT_HALF);
    gx[gx_off + e] = d * (cdf + v * INV_SQRT_2PI * exp((${T}) -0.5 * v * v));
% elif ACT == 'gelu_tanh':
    /* s = (1 + tanh u) / 2 = 1 / (1 + exp(-2u)); d/du of s = 2 s (1 - s) */
    const ${T} s = (${T}) 1 / ((${T}) 1 + exp((${T}) -2 * SQRT_2_OVER_PI * (v + GELU_CUBIC * v * v * v)));
    const ${T} du = SQRT_2_OVER_PI * ((${T}) 1 + (${T}) 3 * GELU_CUBIC * v * v);
    gx[gx_off + e] = d * (s + (${T}) 2 * v * s * ((${T}) 1 - s) * du);
% endif
}

__kernel void add_relu(__global const ${T}* a, const long a_off, __global const ${T}* b, const long b_off,
                       __global ${T}* y, const long y_off, const long n)
{
    const long e = get_global_id(0);
    if (${beyond('e', 'n')}) return;
    const ${T} s = a[a_off + e] + b[b_off + e];
    y[y_off + e] = s > (${T}) 0 ? s : (${T}) 0;
}

__kernel void relu_backward(__global const ${T}* y, const long y_off, __global const ${T}* g, const long g_off,
                            __global ${T}* gx, const long gx_off, const long n)
{
    const long e = get_global_id(0);
    if (${beyond('e', 'n')}) return;
    const ${T} out = y[y_off + e], grad = g[g_off + e];  /* both loaded: a select, not a branch */
    gx[gx_off + e] = out > (${T}) 0 ? grad : (${T}) 0;
}

__kernel void softmax_forward(__global const ${T}* x, const long x_off, __global ${T}* y, const long y_off,
                              const int outer, const int D, const int inner)
{
    const int k = get_global_id(0);
    const int o = get_global_id(1);
    if (${beyond('k', 'inner')} || ${beyond('o', 'outer', 1)}) return;
    const long base = (long) o * D * inner + k;
    __global const ${T}* xr = x + x_off + base;
    __global ${T}* yr = y + y_off + base;
    ${T} m = xr[0];
    for (int d = 1; d < D; ++d) m = fmax(m, xr[(long) d * inner]);
    ${T} s = 0;
    for (int d = 0; d < D; ++d) s += exp(xr[(long) d * inner] - m);
% if LOG:
    const ${T} lse = m + log(s);
    for (int d = 0; d < D; ++d) yr[(long) d * inner] = xr[(long) d * inner] - lse;
% else:
    const ${T} inv = (${T}) 1 / s;
    for (int d = 0; d < D; ++d) yr[(long) d * inner] = exp(xr[(long) d * inner] - m) * inv;
% endif
}

__kernel void softmax_backward(__global const ${T}* y, const long y_off, __global const ${T}* g, const long g_off,
                               __global ${T}* gx, const long gx_off, const int outer, const int D, const int inner)
{
    const int k = get_global_id(0);
    const int o = get_global_id(1);
    if (${beyond('k', 'inner')} || ${beyond('o', 'outer', 1)}) return;
    const long base = (long) o * D * inner + k;
    __global const ${T}* yr = y + y_off + base;
    __global const ${T}* gr = g + g_off + base;
    __global ${T}* out = gx + gx_off + base;
    ${T} s = 0;
% if LOG:
    for (int d = 0; d < D; ++d) s += gr[(long) d * inner];
    for (int d = 0; d < D; ++d) out[(long) d * inner] = gr[(long) d * inner] - exp(yr[(long) d * inner]) * s;
% else:
    for (int d = 0; d < D; ++d) s += gr[(long) d * inner] * yr[(long) d * inner];
    for (int d = 0; d < D; ++d) out[(long) d * inner] = yr[(long) d * inner] * (gr[(long) d * inner] - s);
% endif
}
