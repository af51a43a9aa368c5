<%doc>
Fused optimizer updates, one work-item per parameter element, in place; PyTorch's semantics exactly.

sgd_step (torch.optim.SGD):
  g = grad + WD * p
  MOMENTUM: buf = first ? g : momentum * buf + (1 - dampening) * g
            g   = NESTEROV ? g + momentum * buf : buf
  p -= lr * g
adam_step (torch.optim.Adam, amsgrad off):
  g = grad + WD * p
  m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g*g
  p -= step_size * m / (sqrt(v) / sqrt_bc2 + eps)     with step_size = lr / (1 - b1^t), sqrt_bc2 = sqrt(1 - b2^t)
  (the bias corrections are computed on the host in double precision and passed in.)

Template parameters (all have defaults):
  T         C element type                         (default "float")
  WD        apply weight decay                     (default False)
  MOMENTUM  sgd: keep a momentum buffer            (default False)
  NESTEROV  sgd: Nesterov momentum                 (default False)
Launch: 1-D over n elements, any local size; the tail is guarded.
</%doc>
<%page args="T='float', WD=False, MOMENTUM=False, NESTEROV=False"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void sgd_step(
    __global ${T}* p, const long p_off,
    __global const ${T}* grad, const long g_off,
    __global ${T}* buf, const long buf_off,
    const long n, const ${T} lr, const ${T} momentum, const ${T} dampening, const ${T} wd, const int first)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const ${T} w = p[p_off + i];
    ${T} g = grad[g_off + i];
% if WD:
    g += wd * w;
% endif
% if MOMENTUM:
    const ${T} b = first ? g : momentum * buf[buf_off + i] + ((${T}) 1 - dampening) * g;
    buf[buf_off + i] = b;
  % if NESTEROV:
    g = g + momentum * b;
  % else:
    g = b;
  % endif
% endif
    p[p_off + i] = w - lr * g;
}

__kernel void adam_step(
    __global ${T}* p, const long p_off,
    __global const ${T}* grad, const long g_off,
    __global ${T}* m, const long m_off,
    __global ${T}* v, const long v_off,
    const long n, const ${T} step_size, const ${T} b1, const ${T} b2, const ${T} eps, const ${T} sqrt_bc2,
    const ${T} wd)
{
    const long i = get_global_id(0);
    if (i >= n) return;
    const ${T} w = p[p_off + i];
    ${T} g = grad[g_off + i];
% if WD:
    g += wd * w;
% endif
    const ${T} mi = b1 * m[m_off + i] + ((${T}) 1 - b1) * g;
    const ${T} vi = b2 * v[v_off + i] + ((${T}) 1 - b2) * g * g;
    m[m_off + i] = mi;
    v[v_off + i] = vi;
    p[p_off + i] = w - step_size * mi / (sqrt(vi) / sqrt_bc2 + eps);
}
