<%doc>
Products of a few rows against a matrix read along K: C (M x N) = alpha * A (M x K) @ op(B) + beta * C, where
op(B)[k, n] = B[n * ldb + k]. That is a Linear layer at a small batch: its weight (out, in) is read as its
transpose, unit stride along K. The tiled GEMM would first pack such a B into column panels (a transpose of
the whole weight per call); here every weight row is read once, in place, with vector loads along K, and
dotted with every row of A (which stays in the cache), so the product runs at the rate the weight streams
from memory.

Template parameters (all have defaults):
  T     element type, "float" or "double"                                    (default "float")
  ROWS  M, the rows of A and C, compiled in (1 to 8)                          (default 1)
  NB    columns of C per work-item                                          (default 4)
  VW    lanes of the vectors along K                                         (default 8)

Scalar arguments: N, K, alpha, beta; A's row stride lda (its columns are unit stride), B's row stride ldb,
C's row and column strides. With beta == 0, C is not read (it may hold anything, NaN included).

Launch: global (ceil(N / NB)); any work-group size (the host's choice: one work-item a group on a CPU,
as the explicit vectors are the parallelism there).
Vectors are assembled from element loads (netcl.runtime.cl_vectors says why).
</%doc>
<%page args="T='float', ROWS=1, NB=4, VW=8"/>
<%! from netcl.runtime.cl_vectors import vload %>
<%
    VT = T + str(VW)
    HEX = "0123456789abcdef"
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

__kernel void gemm_dot(
    const int N, const int K, const ${T} alpha, const ${T} beta,
    __global const ${T}* a, const long a_off, const long lda,
    __global const ${T}* b, const long b_off, const long ldb,
    __global ${T}* c, const long c_off, const long c_rs, const long c_cs)
{
    const int n0 = get_global_id(0) * ${NB};
    if (n0 >= N) return;
% for j in range(NB):
    /* a column past N reads the last one again (its sums are not stored) */
    __global const ${T}* b${j} = b + b_off + (long)min(n0 + ${j}, N - 1) * ldb;
% endfor
% for m in range(ROWS):
    __global const ${T}* a${m} = a + a_off + ${m} * lda;
% endfor
% for m in range(ROWS):
    ${VT} ${', '.join('acc%d_%d = (%s)0' % (m, j, VT) for j in range(NB))};
% endfor
    int k = 0;
    for (; k + ${VW} <= K; k += ${VW}) {
% for j in range(NB):
        const ${VT} w${j} = ${vload(VT, VW, 'b%d + k' % j)};
% endfor
% for m in range(ROWS):
        {
            const ${VT} x = ${vload(VT, VW, 'a%d + k' % m)};
% for j in range(NB):
            acc${m}_${j} = x * w${j} + acc${m}_${j};
% endfor
        }
% endfor
    }
% for m in range(ROWS):
% for j in range(NB):
    ${T} s${m}_${j} = ${' + '.join('acc%d_%d.s%s' % (m, j, HEX[l]) for l in range(VW))};
% endfor
% endfor
    for (; k < K; ++k) {
% for j in range(NB):
        const ${T} w${j} = b${j}[k];
% endfor
% for m in range(ROWS):
% for j in range(NB):
        s${m}_${j} += a${m}[k] * w${j};
% endfor
% endfor
    }
% for m in range(ROWS):
% for j in range(NB):
    if (n0 + ${j} < N) {
        __global ${T}* out = c + c_off + ${m} * c_rs + (long)(n0 + ${j}) * c_cs;
        *out = (beta != (${T})0) ? alpha * s${m}_${j} + beta * *out : alpha * s${m}_${j};
    }
% endfor
% endfor
}
