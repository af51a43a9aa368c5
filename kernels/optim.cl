<%doc>
Fused optimizer updates, in place, PyTorch's semantics exactly. One launch updates N tensors (part of a
parameter group), which saves launches on GPUs. Tensor k owns the work-groups [gend_{k-1}, gend_k)
(gend_{-1} = 0): the tensor a work-item serves depends on its group id only, so control flow is uniform
across a work-group. PoCL still runs N > 1 far slower than N launches of N = 1 (LeNet's 8 tensors: 3-30 ms
against 1.2 ms), so netcl uses N = 1 on CPU devices (netcl.optim.optimizer.fused_tensors_per_launch).

sgd_step (torch.optim.SGD), per element:
  g = grad + WD * p
  MOMENTUM: buf = first_k ? g : momentum * buf + (1 - dampening) * g
            g   = NESTEROV ? g + momentum * buf : buf
  p -= lr * g
adam_step (torch.optim.Adam, amsgrad off), per element:
  g = grad + WD * p
  m = b1 * m + (1 - b1) * g;   v = b2 * v + (1 - b2) * g*g
  p -= step_size_k * m / (sqrt(v) / sqrt_bc2_k + eps)   with step_size_k = lr / (1 - b1^t_k) and
  sqrt_bc2_k = sqrt(1 - b2^t_k), computed on the host in double precision per tensor (its own step t_k).
  DECOUPLED (torch.optim.AdamW): g = grad, and p is first scaled by wd, which then carries 1 - lr * weight_decay
  (also computed on the host in double), as AdamW's param.mul_(1 - lr * weight_decay).
Every "1 - x" arrives from the host, computed in double as PyTorch does: 1 - (float) 0.999 in float32 is off
by 1.3e-5 relative, which shows in every Adam step.

Template parameters (all have defaults):
  T         C element type                         (default "float")
  N         tensors updated by one launch          (default 1)
  WD        apply weight decay                     (default False)
  MOMENTUM  sgd: keep a momentum buffer            (default False)
  NESTEROV  sgd: Nesterov momentum                 (default False)
  DECOUPLED adam: AdamW's decoupled weight decay   (default False; only with WD)
Launch: 1-D, gend_{N-1} work-groups of any local size; each tensor's tail is guarded.
</%doc>
<%page args="T='float', N=1, WD=False, MOMENTUM=False, NESTEROV=False, DECOUPLED=False"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif
<%def name="group_ends()">${", ".join("const long gend%d" % k for k in range(N))}</%def>
## The element of tensor k that this work-item updates (its work-groups start at gend_{k-1}).
<%def name="element_index(k)">${group_first(k)} + get_local_id(0)</%def>
<%! def group_first(k): return "(get_group_id(0) - %s) * (long) get_local_size(0)" % ("0" if k == 0 else "gend%d" % (k - 1)) %>

inline void sgd_one(__global ${T}* p, __global const ${T}* grad, __global ${T}* buf, const long i,
                    const ${T} lr, const ${T} momentum, const ${T} undamped, const ${T} wd, const int first)
{
    const ${T} w = p[i];
    ${T} g = grad[i];
% if WD:
    g += wd * w;
% endif
% if MOMENTUM:
    const ${T} b = first ? g : momentum * buf[i] + undamped * g;
    buf[i] = b;
  % if NESTEROV:
    g = g + momentum * b;
  % else:
    g = b;
  % endif
% endif
    p[i] = w - lr * g;
}

__kernel void sgd_step(
% for k in range(N):
    __global ${T}* p${k}, const long p${k}_off, __global const ${T}* g${k}, const long g${k}_off,
    __global ${T}* b${k}, const long b${k}_off, const long n${k}, const int first${k},
% endfor
    ${group_ends()}, const ${T} lr, const ${T} momentum, const ${T} undamped, const ${T} wd)
{
% for k in range(N):
    if (get_group_id(0) < gend${k}) {
        const long i = ${element_index(k)};
        if (!${beyond('i', 'n%d' % k, group_first=group_first(k))})
            sgd_one(p${k} + p${k}_off, g${k} + g${k}_off, b${k} + b${k}_off, i, lr, momentum, undamped, wd,
                    first${k});
        return;
    }
% endfor
}

inline void adam_one(__global ${T}* p, __global const ${T}* grad, __global ${T}* m, __global ${T}* v, const long i,
                     const ${T} step_size, const ${T} sqrt_bc2, const ${T} b1, const ${T} one_minus_b1,
                     const ${T} b2, const ${T} one_minus_b2, const ${T} eps, const ${T} wd)
{
% if WD and DECOUPLED:
    const ${T} w = p[i] * wd;
    const ${T} g = grad[i];
% else:
    const ${T} w = p[i];
    ${T} g = grad[i];
  % if WD:
    g += wd * w;
  % endif
% endif
    const ${T} mi = b1 * m[i] + one_minus_b1 * g;
    const ${T} vi = b2 * v[i] + one_minus_b2 * g * g;
    m[i] = mi;
    v[i] = vi;
    p[i] = w - step_size * mi / (sqrt(vi) / sqrt_bc2 + eps);
}

__kernel void adam_step(
% for k in range(N):
    __global ${T}* p${k}, const long p${k}_off, __global const ${T}* g${k}, const long g${k}_off,
    __global ${T}* m${k}, const long m${k}_off, __global ${T}* v${k}, const long v${k}_off, const long n${k},
    const ${T} step_size${k}, const ${T} sqrt_bc2_${k},
% endfor
    ${group_ends()}, const ${T} b1, const ${T} one_minus_b1, const ${T} b2, const ${T} one_minus_b2,
    const ${T} eps, const ${T} wd)
{
% for k in range(N):
    if (get_group_id(0) < gend${k}) {
        const long i = ${element_index(k)};
        if (!${beyond('i', 'n%d' % k, group_first=group_first(k))})
            adam_one(p${k} + p${k}_off, g${k} + g${k}_off, m${k} + m${k}_off, v${k} + v${k}_off, i, step_size${k},
                     sqrt_bc2_${k}, b1, one_minus_b1, b2, one_minus_b2, eps, wd);
        return;
    }
% endfor
}
