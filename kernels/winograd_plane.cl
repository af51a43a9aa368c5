<%doc>
Winograd F(2x2, 3x3) input and output transforms for small planes, one work-item per whole plane with
the geometry compiled in (kernels/winograd.cl has the general forms and defines the transforms and the
[16][channels][tiles] layout; t = (n * TH + ty) * TW + tx).

  wino_input_plane    V[e][c][t] = (B^T d B)[e] of every tile of plane (n, c), d = the 4x4 patch of src at
                      (2*ty - PH, 2*tx - PW), zero outside the source (PH, PW may be negative)
  wino_output_plane   dst[n][k][2ty+i][2tx+j] = (A^T m A)[i][j], every tile of plane (n, k), the positions
                      inside dst only

Why: on small images (cv12: 7x7 input, 3x3 tiles) the general kernels' tile grid is tiny, so a CPU driver
cannot vectorize along it and every tile pays run-time bounds checks. Here the bounds, the zero padding
and the tile loops are resolved when the template is rendered, the plane is read once into registers,
and neighbouring work-items (dimension 0 runs over the samples n) write neighbouring tiles of V.

A row of tiles is unrolled; the rows whose patches lie wholly inside the plane (input: all four source
rows; output: both destination rows) run as a loop over that one unrolled row, the border rows unrolled
apart: unrolling every row of 8 x 8 tiles took PoCL 2.5-7 s to compile a layer's pair of kernels.

Template parameters (all have defaults; keep TH * TW small: netcl.ops.conv_winograd.PLANE_MAX_TILES):
  T         element type, "float" or "double"                        (default "float")
  N         samples in the launch (the chunk)                         (default 1)
  CH        channels of the transformed plane set                      (default 1)
  IH IW     input plane size (wino_input_plane)                        (default 4 4)
  PH PW     padding of the input plane, may be negative                (default 0 0)
  OH OW     output plane size (wino_output_plane)                      (default 2 2)
  TH TW     tiles per plane: ceil(out_h / 2), ceil(out_w / 2)          (default 1 1)
  VN        samples per work-item, the lanes of its vectors            (default 1)
  BIAS      wino_output_plane adds bias[k] to every output of channel k (default False)
  RESIDUAL  wino_output_plane then adds residual[n][k][h][w], a tensor of dst's shape (default False)
  ACT       wino_output_plane then applies "none", "relu", "relu6" or "hardswish": an inference
            epilogue with the bits of the separate pass (netcl.runtime.cl_activation) (default "none")

Launch: 2-D, global (N, CH), any local size (tails guarded). estride is the elements from one of the 16
matrices to the next (netcl.ops.conv_winograd.matrix_stride).
No OpenCL built-in function takes or returns a vector here (netcl.runtime.cl_vectors says why).
</%doc>
<%page args="T='float', N=1, CH=1, IH=4, IW=4, PH=0, PW=0, OH=2, OW=2, TH=1, TW=1, VN=1, BIAS=False, RESIDUAL=False, ACT='none'"/>
<%namespace name="wm" file="_winograd_math.cl"/>
<%! from netcl.runtime import cl_vectors %>
<%! from netcl.runtime.cl_activation import apply_epilogue %>
<%
TILES = N * TH * TW
VT = T if VN == 1 else f"{T}{VN}"
LANES = "0123456789abcdef"[:VN]

def gather(ptr, index, stride):
    """VN samples' values at ptr[index + lane * stride], as one ${VT}"""
    if VN == 1:
        return f"{ptr}[{index}]"
    return f"({VT})(" + ", ".join(f"{ptr}[{index} + {lane * stride}]" for lane in range(VN)) + ")"

def vload(ptr):
    return cl_vectors.vload(VT, VN, ptr)

def vstore(value, ptr):
    return cl_vectors.vstore(value, VN, ptr).rstrip(";")

def to_plane(ty, tx):
    """element (i, j) of tile (ty, tx)'s output to y, where it falls inside the output plane; ty None:
    the tile row of the C loop variable ty, whose rows are all inside"""
    def put(i, j, value):
        w = 2 * tx + j
        if ty is None:
            return f"y[(2 * ty + {i}) * {OW} + {w}] = {value}" if w < OW else ""
        h = 2 * ty + i
        return f"y[{h * OW + w}] = {value}" if h < OH and w < OW else ""
    return put

def looped(rows):
    """(first, end) of the tile rows to run as a loop: ``rows`` (contiguous), when two or more"""
    return (rows[0], rows[-1] + 1) if len(rows) >= 2 else (TH, TH)

# tile rows whose four source rows are all inside the input plane, and whose two output rows all land
IN_LOOP = looped([ty for ty in range(TH) if 0 <= 2 * ty - PH and 2 * ty - PH + 3 < IH])
OUT_LOOP = looped([ty for ty in range(TH) if 2 * ty + 1 < OH])
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

// the 16 elements of B^T d B, each to its matrix
inline void input_tile(const ${VT} d[4][4], __global ${T}* restrict out, const long estride)
{
${wm.input_transform(VT, "d", lambda i, j, value: vstore(value, f"out + (4 * {i} + {j}) * estride"))}\
}

__kernel void wino_input_plane(
    __global const ${T}* restrict src, const long src_off,
    __global ${T}* restrict V, const long v_off, const long estride)
{
    const int n0 = get_global_id(0) * ${VN}, c = get_global_id(1);
    if (n0 >= ${N} || c >= ${CH}) return;
    __global const ${T}* plane = src + src_off + ((long)n0 * ${CH} + c) * ${IH * IW};
    __global ${T}* out = V + v_off + (long)c * ${TILES} + n0;
    ${VT} x[${IH * IW}];
    for (int i = 0; i < ${IH * IW}; ++i) x[i] = ${gather("plane", "i", CH * IH * IW)};
    ${VT} d[4][4];
% for ty in range(TH):
%   if ty == IN_LOOP[0]:
    for (int ty = ${IN_LOOP[0]}; ty < ${IN_LOOP[1]}; ++ty) {
        const int row = (2 * ty - ${PH}) * ${IW};
%     for tx in range(TW):
%       for i in range(4):
%         for j in range(4):
<%          w = 2 * tx - PW + j %>\
        d[${i}][${j}] = ${f"x[row + {i * IW + w}]" if 0 <= w < IW else f"({VT})0"};
%         endfor
%       endfor
        input_tile(d, out + (ty * ${TW} + ${tx}) * ${N}, estride);
%     endfor
    }
%   elif not IN_LOOP[0] < ty < IN_LOOP[1]:
%     for tx in range(TW):
%       for i in range(4):
<%        h = 2 * ty - PH + i %>\
%         for j in range(4):
<%          w = 2 * tx - PW + j %>\
    d[${i}][${j}] = ${f"x[{h * IW + w}]" if 0 <= h < IH and 0 <= w < IW else f"({VT})0"};
%         endfor
%       endfor
    input_tile(d, out + ${(ty * TW + tx) * N}, estride);
%     endfor
%   endif
% endfor
}

// bias and residual are read only with BIAS and RESIDUAL
__kernel void wino_output_plane(
    __global const ${T}* restrict M, const long m_off, const long estride,
    __global ${T}* restrict dst, const long dst_off,
    __global const ${T}* restrict bias, const long bias_off, __global const ${T}* restrict residual,
    const long residual_off)
{
    const int n0 = get_global_id(0) * ${VN}, k = get_global_id(1);
    if (n0 >= ${N} || k >= ${CH}) return;
    __global const ${T}* in = M + m_off + (long)k * ${TILES} + n0;
    ${VT} y[${OH * OW}];
    ${VT} m[4][4];
% for ty in range(TH):
%   if ty == OUT_LOOP[0]:
    for (int ty = ${OUT_LOOP[0]}; ty < ${OUT_LOOP[1]}; ++ty) {
%     for tx in range(TW):
        for (int e = 0; e < 16; ++e) m[e / 4][e % 4] = ${vload(f"in + e * estride + (ty * {TW} + {tx}) * {N}")};
${wm.output_transform(VT, "m", to_plane(None, tx))}\
%     endfor
    }
%   elif not OUT_LOOP[0] < ty < OUT_LOOP[1]:
%     for tx in range(TW):
    for (int e = 0; e < 16; ++e) m[e / 4][e % 4] = ${vload(f"in + e * estride + {(ty * TW + tx) * N}")};
${wm.output_transform(VT, "m", to_plane(ty, tx))}\
%     endfor
%   endif
% endfor
    const long plane_at = ((long)n0 * ${CH} + k) * ${OH * OW};
    __global ${T}* plane = dst + dst_off + plane_at;
% for lane in range(VN):
    for (int i = 0; i < ${OH * OW}; ++i) {
        ${T} out = y[i]${"" if VN == 1 else ".s" + LANES[lane]};
        ${apply_epilogue("out", T, "bias[bias_off + k]" if BIAS else None,
                         f"residual[residual_off + plane_at + {lane * CH * OH * OW} + i]" if RESIDUAL else None, ACT)}
        plane[${lane * CH * OH * OW} + i] = out;
    }
% endfor
}
