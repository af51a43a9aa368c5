<%doc>
Batched GEMM: C[b] = alpha * A[b] @ B[b] + beta * C[b], A: M x K, B: K x N, C: M x N (all in elements).

gemm_tiled: each work-item owns an MR x NR block of C (NR = VW * NV), held in NV vectors of width VW per
row, and walks K: per k step it broadcasts MR scalars of A and loads NV vectors of B, then does MR * NV
vector FMAs. B must have unit stride along N (the host packs B when it has not); A and C may have any
strides. A work-group is WG_M x WG_N work-items; ORDER says which grid dimension runs along N.
With LOCAL=1 the work-group first stages a KC-deep slice of its A (WG_M*MR rows) and B (WG_N*NR columns)
tiles in local memory (zero-padded at the edges) and computes from there: what a GPU wants. With LOCAL=0
every work-item reads global memory directly: what PoCL's CPU driver wants (docs/explanation/gemm.md).
Edges: padding work-items (past M or N) return before touching memory; rows of A beyond M are clamped
(read but never stored); columns of B beyond N are zero in packed panels and, unpacked, are read only in
the tail path, element by element with clamped indices; stores are guarded per element, so nothing
outside the operands is touched. Batch strides may be 0 (a broadcast operand).
The file calls no OpenCL built-in function (vloadN, vstoreN, fma, min): the PoCL wheel cannot inline
them on CPUs whose LLVM name differs from its built-in library's variant, and each became a call
(7x slower; docs/explanation/gemm.md). Vectors are assembled from element loads, which compile to the
same loads.

Template parameters (defaults in the page tag):
  T      element type, "float" or "double"                        (float)
  MR     rows of C per work-item                                  (4)
  VW     vector width of the B loads and the accumulators         (8)
  NV     vectors per row of the register tile (NR = VW * NV)      (2)
  WG_M   work-items per work-group along M                        (1)
  WG_N   work-items per work-group along N                        (1)
         With LOCAL=0 the kernel does not depend on the work-group shape: it carries no
         reqd_work_group_size, and netcl renders it with WG_M = WG_N = 1 and launches it with the
         tuned shape, so products that differ only in shape share one program (one build).
  KU     unroll factor of the K loop (LOCAL=0)                    (1)
  LOCAL  stage tiles in local memory (0/1)                        (0)
  KC     K depth of a local-memory stage (LOCAL=1)                (16)
  PACK_B B comes packed by gemm_pack_b (LOCAL=0 only): panels of NR columns, k-major, zero-padded;
         b_bs is then the packed batch stride and b_rs/b_cs are ignored                    (0)
  PACK_A A comes packed by gemm_pack_a (LOCAL=0 only): panels of MR rows, k-major, zero-padded;
         a_bs is then the packed batch stride and a_rs/a_cs are ignored                    (0)
  ORDER  "nm": dimension 0 of the grid walks N-blocks, 1 walks M-blocks; "mn": the reverse, so
         consecutive work-items share a B panel instead of an A panel               ("nm")
  BIAS   gemm_tiled adds bias[bias_off + row] to every element of C's row (a convolution's output
         channel) as it stores                                                        (False)
  RESIDUAL  then adds the element of `residual` at C's position, addressed with C's strides from
         residual_off                                                                 (False)
  ACT    then applies "none", "relu", "relu6" or "hardswish" (netcl.runtime.cl_activation: the bits of
         the separate pass kernels/batchnorm.cl's bn_apply makes). With these three the product stores
         act(alpha * A @ B + beta * C + bias + residual), an inference epilogue       ("none")

gemm_pack_a / gemm_pack_b / gemm_pack_bt (LOCAL=0 only) write the panels PACK_A / PACK_B read; the
host picks gemm_pack_bt for a B whose unit stride runs along K.
</%doc>
<%! from netcl.runtime import cl_vectors %>\
<%! from netcl.runtime.cl_activation import apply_epilogue %>\
<%page args="T='float', MR=4, VW=8, NV=2, WG_M=1, WG_N=1, KU=1, LOCAL=0, KC=16, PACK_B=0, PACK_A=0, ORDER='nm', BIAS=False, RESIDUAL=False, ACT='none'"/>
<%
    NR = VW * NV
    V = T if VW == 1 else '%s%d' % (T, VW)
    BM = WG_M * MR
    BN = WG_N * NR
    # No OpenCL built-in function (vloadN, vstoreN, fma, min) is called in this file: a driver whose
    # built-in library was compiled for other CPU features than the kernel cannot inline them (the PoCL
    # wheel on CPUs its LLVM does not know: docs/explanation/gemm.md), and then every one is a function
    # call. Vectors are assembled from element loads and stored element by element, which LLVM turns
    # into the same unaligned vector loads and stores; a * b + c is contracted into an FMA where the
    # target has one.
    def vload(ptr):
        return cl_vectors.vload(V, VW, ptr)
    def vstore(value, ptr):
        return cl_vectors.vstore(value, VW, ptr)
    lesser = cl_vectors.lesser
    def lane(v, l):
        return v if VW == 1 else '%s.s%x' % (v, l)
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

<%def name="fma_step(aexpr, bexpr)">\
    {
% for j in range(NV):
        const ${V} b${j} = ${bexpr(j)};
% endfor
% for i in range(MR):
        const ${T} a${i} = ${aexpr(i)};
% for j in range(NV):
        acc${i}_${j} = (${V})a${i} * b${j} + acc${i}_${j};
% endfor
% endfor
    }
</%def>

<%def name="epilogue(value, value_type, residual_value)">\
${apply_epilogue(value, value_type, "shift" if BIAS else None, residual_value if RESIDUAL else None, ACT)}\
</%def>

<% DN, DM = (0, 1) if ORDER == 'nm' else (1, 0) %>
% if not LOCAL:
// One work-item per k of one MR-row panel: Ap[b][panel][k][0..MR) = A[b][panel*MR + i][k], zero past M.
__kernel void gemm_pack_a(const int M, const int K, const int batch,
    __global const ${T}* A, const long a_off, const long a_rs, const long a_cs, const long a_bs,
    __global ${T}* Ap)
{
    const int k = get_global_id(0), p = get_global_id(1), b = get_global_id(2);
    if (k >= K || b >= batch) return;
    const int panels = (M + ${MR - 1}) / ${MR};
    __global const ${T}* src = A + a_off + b * a_bs + k * a_cs;
    __global ${T}* dst = Ap + (((long)b * panels + p) * K + k) * ${MR};
    const int m0 = p * ${MR};
% for i in range(MR):
    dst[${i}] = (m0 + ${i} < M) ? src[(long)(m0 + ${i}) * a_rs] : (${T})0;
% endfor
}

// One work-item per row of NR packed columns: Bp[b][panel][k][0..NR) = B[b][k][panel*NR + c], zero past N.
__kernel void gemm_pack_b(const int K, const int N, const int batch,
    __global const ${T}* B, const long b_off, const long b_rs, const long b_cs, const long b_bs,
    __global ${T}* Bp)
{
    const int k = get_global_id(0), p = get_global_id(1), b = get_global_id(2);
    if (k >= K || b >= batch) return;
    const int panels = (N + ${NR - 1}) / ${NR};
    __global const ${T}* src = B + b_off + b * b_bs + k * b_rs;
    __global ${T}* dst = Bp + (((long)b * panels + p) * K + k) * ${NR};
    const int n0 = p * ${NR};
    if (n0 + ${NR} <= N && b_cs == 1) {
% for j in range(NV):
% if VW == 1:
        dst[${j}] = src[n0 + ${j}];
% else:
        ${vstore(vload('src + n0 + %d' % (j * VW)), 'dst + %d' % (j * VW))}
% endif
% endfor
    } else {
        for (int c = 0; c < ${NR}; ++c)
            dst[c] = (n0 + c < N) ? src[(long)(n0 + c) * b_cs] : (${T})0;
    }
}

// B with unit stride along K (a transposed B): one work-item per 16 k of one panel reads 16-element runs
// of NR rows and writes them as a 16 x NR block of packed rows. The block is written in place, column by
// column, not staged in a private tile: it is 16·NR elements of one cache-resident region either way,
// and PoCL replicates a private tile per work-item of its chosen work-group (a 16x48 float tile and a
// K = 8192 grid overflowed its worker's stack: a segfault in LeNet's backward pass at batch 128).
__kernel void gemm_pack_bt(const int K, const int N, const int batch,
    __global const ${T}* B, const long b_off, const long b_cs, const long b_bs, __global ${T}* Bp)
{
    const int k0 = get_global_id(0) * 16, p = get_global_id(1), b = get_global_id(2);
    if (k0 >= K || b >= batch) return;
    const int panels = (N + ${NR - 1}) / ${NR};
    const int kn = ${lesser('16', 'K - k0')};
    const int n0 = p * ${NR};
    __global const ${T}* src = B + b_off + b * b_bs + k0;
    __global ${T}* dst = Bp + (((long)b * panels + p) * K + k0) * ${NR};
    for (int c = 0; c < ${NR}; ++c) {
        __global const ${T}* row = src + (long)${lesser('n0 + c', 'N - 1')} * b_cs;
        const int live = n0 + c < N;
        for (int kk = 0; kk < kn; ++kk)
            dst[kk * ${NR} + c] = live ? row[kk] : (${T})0;
    }
}
% endif

__kernel
% if LOCAL:
__attribute__((reqd_work_group_size(${(WG_N, WG_M)[DN]}, ${(WG_N, WG_M)[DM]}, 1)))
% endif
% if VW > 1:
// Vectorized by hand: the hint keeps a compiler that vectorizes across work-items (Intel's) from doing
// so as well, which with an epilogue's bias and groups of 32 work-items along N ran several times slower
__attribute__((vec_type_hint(${V})))
% endif
void gemm_tiled(
    const int M, const int N, const int K, const int batch, const ${T} alpha, const ${T} beta,
    __global const ${T}* A, const long a_off, const long a_rs, const long a_cs, const long a_bs,
    __global const ${T}* B, const long b_off, const long b_rs, const long b_cs, const long b_bs,
    __global ${T}* C, const long c_off, const long c_rs, const long c_cs, const long c_bs,
    __global const ${T}* bias, const long bias_off, __global const ${T}* residual, const long residual_off)
{
    const int bidx = get_global_id(2);
    const int n0 = get_global_id(${DN}) * ${NR};
    const int m0 = get_global_id(${DM}) * ${MR};
    A += a_off + bidx * a_bs;
    B += b_off + bidx * b_bs;
    C += c_off + bidx * c_bs;
% if RESIDUAL:
    residual += residual_off + bidx * c_bs;
% endif
% for i in range(MR):
% for j in range(NV):
    ${V} acc${i}_${j} = (${V})0;
% endfor
% endfor
% if not LOCAL:
    if (m0 >= M || n0 >= N) return;  // grid padding (no barriers on this path, so leaving early is fine)
% if PACK_A:
    __global const ${T}* apanel = A + (long)(m0 / ${MR}) * K * ${MR};
% for i in range(MR):
    __global const ${T}* ap${i} = apanel + ${i};
% endfor
<% a_cs = MR %>
% else:
    // Rows past M are clamped to M-1: valid addresses whose results are never stored.
% for i in range(MR):
    __global const ${T}* ap${i} = A + ${lesser('m0 + %d' % i, 'M - 1')} * a_rs;
% endfor
<% a_cs = 'a_cs' %>
% endif
% if PACK_B:
    {
        __global const ${T}* bp = B + (long)(n0 / ${NR}) * K * ${NR};
<% b_rs = NR %>
% else:
<% b_rs = 'b_rs' %>
    if (n0 + ${NR} <= N) {
        __global const ${T}* bp = B + n0;
% endif
        int k = 0;
% if KU > 1:
        for (; k + ${KU} <= K; k += ${KU}) {
% for u in range(KU):
${fma_step(lambda i: 'ap%d[(k + %d) * %s]' % (i, u, a_cs), lambda j: vload('bp + (k + %d) * %s + %d' % (u, b_rs, j * VW)))}
% endfor
        }
% endif
        for (; k < K; ++k) {
${fma_step(lambda i: 'ap%d[k * %s]' % (i, a_cs), lambda j: vload('bp + k * %s + %d' % (b_rs, j * VW)))}
        }
% if not PACK_B:
    } else {
        // Column tail: element loads with indices clamped to N-1 (those lanes are never stored).
        for (int k = 0; k < K; ++k) {
            __global const ${T}* bp = B + k * b_rs;
% for j in range(NV):
% if VW == 1:
            const ${V} t${j} = bp[${lesser('n0 + %d' % j, 'N - 1')}];
% else:
            const ${V} t${j} = (${V})(${', '.join('bp[%s]' % lesser('n0 + %d' % (j * VW + l), 'N - 1') for l in range(VW))});
% endif
% endfor
${fma_step(lambda i: 'ap%d[k * %s]' % (i, a_cs), lambda j: 't%d' % j)}
        }
% endif
    }
% else:
    // Work-group tiles staged in local memory, KC deep; As is k-major so a work-item's MR values for
    // one k are adjacent, Bs is k-major too so its NR columns are a contiguous vector run.
    __local ${T} As[${KC}][${BM}];
    __local ${T} Bs[${KC}][${BN}];
    const int lx = get_local_id(${DN}), ly = get_local_id(${DM});
    const int lid = ly * ${WG_N} + lx;
    const int gm0 = get_group_id(${DM}) * ${BM}, gn0 = get_group_id(${DN}) * ${BN};
    // Neighbouring work-items copy neighbouring addresses (coalesced on a GPU): along K when that is
    // the operand's unit-stride direction, else along M / N.
    const int a_kfast = a_cs == 1, b_kfast = b_cs != 1 && b_rs == 1;
    for (int k0 = 0; k0 < K; k0 += ${KC}) {
        for (int e = lid; e < ${KC * BM}; e += ${WG_M * WG_N}) {
            const int kk = a_kfast ? e % ${KC} : e / ${BM}, mm = a_kfast ? e / ${KC} : e % ${BM};
            const int gm = gm0 + mm, gk = k0 + kk;
            As[kk][mm] = (gm < M && gk < K) ? A[gm * a_rs + gk * a_cs] : (${T})0;
        }
        for (int e = lid; e < ${KC * BN}; e += ${WG_M * WG_N}) {
            const int kk = b_kfast ? e % ${KC} : e / ${BN}, nn = b_kfast ? e / ${KC} : e % ${BN};
            const int gn = gn0 + nn, gk = k0 + kk;
            Bs[kk][nn] = (gn < N && gk < K) ? B[gk * b_rs + gn * b_cs] : (${T})0;
        }
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int kk = 0; kk < ${KC}; ++kk) {
${fma_step(lambda i: 'As[kk][ly * %d + %d]' % (MR, i), lambda j: vload('&Bs[kk][lx * %d + %d]' % (NR, j * VW)))}
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
% endif
    if (m0 >= M || n0 >= N) return;
    const int full_n = (n0 + ${NR} <= N) && c_cs == 1;
% for i in range(MR):
    if (m0 + ${i} < M) {
        __global ${T}* cp = C + (m0 + ${i}) * c_rs;
% if RESIDUAL:
        __global const ${T}* rp = residual + (m0 + ${i}) * c_rs;
% endif
% if BIAS:
        const ${T} shift = bias[bias_off + m0 + ${i}];
% endif
% for j in range(NV):
        {
            ${V} r = alpha * acc${i}_${j};
            if (full_n) {
% if VW == 1:
                if (beta != (${T})0) r += beta * cp[n0 + ${j}];
                ${epilogue('r', V, 'rp[n0 + %d]' % j)}
                cp[n0 + ${j}] = r;
% else:
                if (beta != (${T})0) r += beta * ${vload('cp + n0 + %d' % (j * VW))};
                ${epilogue('r', V, vload('rp + n0 + %d' % (j * VW)))}
                ${vstore('r', 'cp + n0 + %d' % (j * VW))}
% endif
            } else {
% for l in range(VW):
                if (n0 + ${j * VW + l} < N) {
                    const long at = (long)(n0 + ${j * VW + l}) * c_cs;
                    ${T} v = ${lane('r', l)};
                    if (beta != (${T})0) v += beta * cp[at];
                    ${epilogue('v', T, 'rp[at]')}
                    cp[at] = v;
                }
% endfor
            }
        }
% endfor
    }
% endfor
}
