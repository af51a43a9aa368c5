<%doc>
Reference batched GEMM: C[b] = alpha * A[b] @ B[b] + beta * C[b], one work-item per element of C.
Every operand is addressed through (offset, row stride, column stride, batch stride) in elements, so
transposes, views and broadcast batches (batch stride 0) need no copies.

Template parameters (all have defaults):
  T    C element type   (default "float")
</%doc>
<%page args="T='float'"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void gemm_reference(
    const int M, const int N, const int K, const int batch,
    const ${T} alpha, const ${T} beta,
    __global const ${T}* A, const long a_off, const long a_rs, const long a_cs, const long a_bs,
    __global const ${T}* B, const long b_off, const long b_rs, const long b_cs, const long b_bs,
    __global ${T}* C, const long c_off, const long c_rs, const long c_cs, const long c_bs)
{
    const int n = get_global_id(0), m = get_global_id(1), b = get_global_id(2);
    if (n >= N || m >= M || b >= batch) return;
    __global const ${T}* a = A + a_off + b * a_bs + m * a_rs;
    __global const ${T}* bb = B + b_off + b * b_bs + n * b_cs;
    ${T} acc = 0;
    for (int k = 0; k < K; ++k) acc += a[k * a_cs] * bb[k * b_rs];
    __global ${T}* c = C + c_off + b * c_bs + m * c_rs + n * c_cs;
    *c = (beta == (${T})0) ? alpha * acc : alpha * acc + beta * *c;
}
