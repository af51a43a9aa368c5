<%doc>
The textbook GEMM used only as a yardstick by `netcl bench gemm`: C = A @ B for contiguous row-major
operands, TS x TS work-groups, each work-item computes one element of C, and the work-group steps
through K staging one TS x TS tile of A and one of B in local memory (zero-padded at the edges).

Template parameters:
  T   element type                   (float)
  TS  tile side = work-group side    (16)
</%doc>
<%page args="T='float', TS=16"/>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel __attribute__((reqd_work_group_size(${TS}, ${TS}, 1)))
void gemm_textbook(const int M, const int N, const int K,
                   __global const ${T}* A, __global const ${T}* B, __global ${T}* C)
{
    __local ${T} As[${TS}][${TS}];
    __local ${T} Bs[${TS}][${TS}];
    const int tx = get_local_id(0), ty = get_local_id(1);
    const int n = get_global_id(0), m = get_global_id(1);
    ${T} acc = 0;
    for (int k0 = 0; k0 < K; k0 += ${TS}) {
        As[ty][tx] = (m < M && k0 + tx < K) ? A[(long)m * K + k0 + tx] : (${T})0;
        Bs[ty][tx] = (n < N && k0 + ty < K) ? B[(long)(k0 + ty) * N + n] : (${T})0;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < ${TS}; ++k) acc += As[ty][k] * Bs[k][tx];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (m < M && n < N) C[(long)m * N + n] = acc;
}
