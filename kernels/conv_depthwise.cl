<%doc>
Depthwise convolution (the `depthwise` strategy): groups == input channels C, K = M·C output channels
(M, the channel multiplier, ≥ 1), NCHW tensors, weight (K, 1, R, S). Output channel k reads input channel
k / M only, so each pass is R·S multiply-adds per element it produces: bound by memory, not arithmetic.

A work-group owns one plane and a run of its rows; its L work-items share each row's columns. A row's
columns split into the interior, whose every tap reads inside the tensor, and the borders (padding).
The interior goes in strips of VW adjacent columns, one vector (T<VW>) per strip, with no bounds test:
each tap is a run of consecutive (unit stride) loads, which the compiler makes one vector load; a last
strip that would run past the interior is moved back to end where it ends (forward and backward_data
compute some columns twice, with the same result; backward_weight masks the columns counted already).
The border columns go one by one with bounds tests, or (EDGE_STRIPS, a CPU's forward pass) in strips
of their own whose taps' lanes in the padding read zero, the row then going in strips from end to end.
Row tests are branches the whole group shares.
A CPU runs L = 1 with VW = its vector width (its compiler then keeps the vectors as written); a GPU
runs VW = 1 with L adjacent columns (coalesced loads). A CPU's forward pass on rows of at most one
vector (WHOLE_ROWS) takes each row as one vector, borders included: a lane whose tap falls in the padding
is masked, and the taps of one column offset are summed before their one mask. Consecutive elements are
loaded and stored through an unaligned vector type (LLVM assembles the overlapping element loads of a
row's taps from pieces and shuffles). No atomics: every result is deterministic.

  depthwise_forward          y[n,k,p,q] = act(Σ_{r,s} x[n, k/M, p·SH − PH + r·DH, q·SW − PW + s·DW] · w[k,0,r,s]
                                              + bias[k] + residual[n,k,p,q])
                             group (run of rows, plane n·K + k); the bias, residual and activation are
                             each optional (BIAS, RESIDUAL, ACT), applied in that order as it stores
  depthwise_backward_data    gx[n,c,h,v] = Σ_{j<M} Σ_{r,s: h + PH − r·DH = p·SH, v + PW − s·DW = q·SW} gy[n, c·M + j, p, q] · w[c·M + j,0,r,s]
                             group (run of rows, plane n·C + c). A row's columns go by phase,
                             v = phase + SW·i: tap s serves a whole phase (when SW divides
                             phase + PW − s·DW) or none of it, and reads gy columns i + o_s, consecutive.
  depthwise_weight_partial   part[k, r·S + s, chunk, lane] = Σ_{(n,p) in chunk} Σ_{q of the lane} gy[n,k,p,q] · x[n, k/M, p·SH − PH + r·DH, q·SW − PW + s·DW]
                             group (chunk of the N·P output rows, k); lane = work-item · VW + vector
                             lane (a work-item's border columns count in its first lane). The host sums
                             each (k, tap) over the chunks and lanes with one reduction (netcl.ops.reduce):
                             partial sums per work-group, then a small reduce, instead of atomics.

Template parameters (all have defaults):
  KERNEL the one kernel the program holds: "forward", "backward_data" or "weight_partial"
                                                                                 (default "forward")
  T      element type, "float" or "double"                                       (default "float")
  VW     columns per interior strip, one vector: 1, 2, 4, 8 or 16                (default 16)
  R, S   kernel height and width (compiled in: the taps unroll, the weights stay in registers)
                                                                                 (default 3, 3)
  SH, SW stride (compiled in: a unit stride makes a tap's loads consecutive)     (default 1, 1)
  DH, DW dilation                                                                (default 1, 1)
  BIAS   forward: add bias[k] to every output of channel k                       (default False)
  RESIDUAL  forward (not FLIP): then add residual[n, k, p, q] (a tensor of the output's shape)
                                                                                 (default False)
  ACT    forward (not FLIP): then apply "none", "relu", "relu6" or "hardswish" (an inference epilogue:
         z = acc + bias; z += residual; activation; the text is netcl.runtime.cl_activation's, so the
         result has the bits of the separate pass kernels/batchnorm.cl's bn_apply makes)  (default "none")
  FLIP   the forward kernel runs backward_data of a stride-1 layer: x is the output gradient, each
         output plane sums the C / K input planes it feeds, weights read flipped   (default False)
  MULT   with FLIP: those input planes per output plane, compiled in (their weights then stay in
         registers); 0 reads the count from C / K and the weights from memory    (default 1)
  WHOLE_ROWS  forward, L = 1: a row of Q ≤ VW outputs is one vector (lanes from Q on idle), no border
         columns                                                                (default False)
  ROW_BLOCK  forward, not WHOLE_ROWS: the interior strips of this many adjacent output rows go together,
         each input row they read loaded once for all of them (a run's last rows go one by one)
                                                                                 (default 1)
  EDGE_STRIPS  forward, not WHOLE_ROWS, VW > 1: strips cover whole rows, those reaching into the padding
         masking their taps' lanes outside the input row, instead of the border columns going one by
         one (planes whose edge strips would read outside the input tensor keep the border columns)
                                                                                 (default False)

Arguments: input, weight, output (buffer, offset each); forward also the bias and the residual (buffer,
offset; any buffer where unused). Scalar arguments: C, H, W (input channels and size), K, P, Q (output
channels and size), PH, PW (top and left padding), then the rows of a group's run (forward,
backward_data) or output rows per chunk and N (depthwise_weight_partial); forward last the input's
size in elements (a whole row's loads reach into the rows before and after, never past the tensor).

Launch: local (L, 1, 1); global (L, runs of P, N·K) forward, (L, runs of H, N·C) backward_data,
(L, chunks of N·P, K) weight partials.
</%doc>
<%page args="T='float', VW=16, R=3, S=3, SH=1, SW=1, DH=1, DW=1, BIAS=False, FLIP=False, MULT=1, KERNEL='forward', RESIDUAL=False, ACT='none', WHOLE_ROWS=False, ROW_BLOCK=1, EDGE_STRIPS=False"/>
<%!
from netcl.runtime.cl_activation import apply_epilogue
from netcl.runtime.cl_vectors import even_odd_definition, unaligned_load, unaligned_store, unaligned_vector_typedef


def vector(type_, width, items):
    """A vector of ``items`` (a scalar when ``width`` is 1)."""
    return "(%s)" % items[0] if width == 1 else "(%s%d)(%s)" % (type_, width, ", ".join(items))


def lane(value, width, index):
    return value if width == 1 else "(%s).s%x" % (value, index)
%>
<%
    VT = T if VW == 1 else T + str(VW)
    IT = ("int" if T == "float" else "long") + ("" if VW == 1 else str(VW))  # a lane mask's type
    ZERO = "(%s)0" % T

    def sources_open():
        """backward_data's loop over the input planes an output plane sums (nothing in forward)."""
        if not FLIP:
            return ""
        loop = ("            for (int j = 0; j < M; ++j) {\n"
                "            __global const %s* xp = xn + (long)j * H * W;" % T)
        return loop if MULT else loop + "\n            __global const %s* wk = wn + j * %d;" % (T, R * S)

    def sources_close():
        return "            }" if FLIP else ""

    def gradient_row(r, column):
        """backward_data: opens the block of tap row r for source j, with ``row`` the output gradient's
        row it reads from ``column`` on, when row h has one (closed by two braces)."""
        return ("{\n"
                "                        const int ph = h + PH - %d;\n"
                "                        const int p = ph / %d;\n"
                "                        if (ph >= 0 && ph %% %d == 0 && p < P) {\n"
                "                            __global const %s* row = gyn + ((long)j * P + p) * Q + %s;"
                % (r * DH, SH, SH, T, column))

    def weight(r, s):
        """Tap (r, s)'s weight: forward's register, or backward_data's flipped load of this source's."""
        if not FLIP:
            return "w%d_%d" % (r, s)
        return "flipped[j][%d]" % (r * S + s) if MULT else "wk[%d]" % ((R - 1 - r) * S + S - 1 - s)
    TAPS = [(r, s) for r in range(R) for s in range(S)]

    def contiguous(ptr, offset="0"):
        return unaligned_load(VW, ptr, offset)

    def store_contiguous(ptr, value):
        return unaligned_store(VW, ptr, value)

    def strip_tap(s):
        """Tap s's input values for an interior strip: row[l·SW + s·DW] for lanes l < VW. At stride 2
        (dilation 1) the lanes are every other element, which element loads would gather one by one;
        instead the low half of the lanes are the even elements of the VW consecutive from row[s] on,
        the high half the odd elements of the VW consecutive from row[s + VW − 1] on, two vector loads
        that read no element the strip does not (row[s] to row[s + 2·VW − 2])."""
        if SW == 2 and DW == 1 and VW > 1:
            low = contiguous("row", s)
            high = contiguous("row", s + VW - 1)
            return "even_odd(%s, %s)" % (low, high)
        if SW == 1:
            return contiguous("row", s * DW)
        return vector(T, VW, ["row[%d]" % (l * SW + s * DW) for l in range(VW)])

    def strip_taps(rows, edge):
        """Statements adding the taps of the strip at column q0 to acc0 .. acc{rows − 1}, the outputs of
        rows p .. p + rows − 1: each input row any of them reads is loaded once (its S taps), and every
        output adds its taps in the order of its rows, then its columns, as a single row does (the same
        rounding whichever path a row takes). In an ``edge`` strip the lanes of tap s whose column is
        outside the input row (inside_s false) read zero, as the padding does."""
        offsets = sorted({i * SH + r * DH for i in range(rows) for r in range(R)})
        lines = []
        for o in offsets:
            lines += ["            {",
                      "                const int h = p * %d - PH + %d;" % (SH, o),
                      "                if (INSIDE(h, H)) {",
                      "                    __global const %s* row = xp + (long)h * W + q0 * %d - PW;" % (T, SW)]
            for t in range(S):
                value = strip_tap(t)
                if edge:
                    value = "inside%d ? %s : (%s)(%s)" % (t, value, VT, ZERO)
                lines += ["                    {", "                        const %s tap = %s;" % (VT, value)]
                for i in range(rows):
                    d = o - i * SH
                    if d >= 0 and d % DH == 0 and d // DH < R:
                        lines.append("                        acc%d = tap * %s + acc%d;" % (i, weight(d // DH, t), i))
                lines.append("                    }")
            lines += ["                }", "            }"]
        return lines

    def strip_rows(rows, edges):
        """forward's strips of output rows p .. p + rows − 1 (a statement). Without ``edges`` they cover
        the interior [lo, hi), a last one moved back to end at hi (the border columns go apart); with
        ``edges`` (EDGE_STRIPS) the whole row, a last one moved back to end at Q, and those reaching
        outside the interior mask their taps' lanes in the padding."""
        lines = ["{"]
        if edges:
            lines += ["        for (int t = lane; t < row_strips; t += lanes) {",
                      "            const int q0 = t * %d < Q - %d ? t * %d : Q - %d;" % (VW, VW, VW, VW)]
        else:
            lines += ["        for (int t = lane; t < strips; t += lanes) {",
                      "            const int q0 = lo + t * %d < hi - %d ? lo + t * %d : hi - %d;" % (VW, VW, VW, VW)]
        lines += ["            %s acc%d = (%s)(%s);" % (VT, i, VT, ZERO) for i in range(rows)]
        if edges:
            lines.append("            if (q0 >= lo && q0 + %d <= hi) {" % VW)
        lines.append(sources_open())
        lines += strip_taps(rows, False)
        lines.append(sources_close())
        if edges:
            lines += ["            } else {",
                      "                const %s columns = (lane_index + q0) * %d - PW;" % (IT, SW)]
            lines += ["                const %s inside%d = (columns >= %d) & (columns < W - %d);" % (IT, t, -t * DW, t * DW)
                      for t in range(S)]
            lines.append(sources_open())
            lines += strip_taps(rows, True)
            lines.append(sources_close())
            lines.append("            }")
        for i in range(rows):
            lines.append("            " + epilogue("acc%d" % i, VT, contiguous("rp", "(long)(p + %d) * Q + q0" % i)))
            lines.append("            " + store_contiguous("yp + (long)(p + %d) * Q + q0" % i, "acc%d" % i))
        lines += ["        }", "    }"]
        return "\n".join(lines)

    def row_loops(edges):
        """forward's strips down the run of rows, ROW_BLOCK at a time, then the run's last rows alone."""
        lines = ["int p = p_begin;"]
        if ROW_BLOCK > 1:
            lines += ["        for (; p + %d <= p_end; p += %d)" % (ROW_BLOCK, ROW_BLOCK),
                      "        " + strip_rows(ROW_BLOCK, edges)]
        lines += ["        for (; p < p_end; ++p)", "        " + strip_rows(1, edges)]
        return "\n".join(lines)

    def epilogue(value, type_, residual):
        """forward's statements on ``value`` (of type_) before it is stored: the bias, the residual
        (an expression of type_), the activation."""
        return apply_epilogue(value, type_, "shift" if BIAS else None, residual if RESIDUAL else None, ACT)
%>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

% if VW > 1:
/* A vector at any element's address: the loads and stores of consecutive elements go through it */
${unaligned_vector_typedef(VT, 8 if T == "double" else 4)}
% endif
#define INSIDE(i, n) ((uint)(i) < (uint)(n))
% if SW == 2 and DW == 1 and VW > 1:

/* A stride-2 strip's tap: the even lanes of `low` then the odd lanes of `high` */
${even_odd_definition(VT, VW)}
% endif

/* A row pass's work-group: its lanes, its run of rows [begin, end) of `rows`, and its plane
   (image, channel) of `channels` per image. */
#define GROUP_OF_ROWS(begin, end, rows, image, channel, channels) \
    const int lane = get_local_id(0), lanes = get_local_size(0); \
    const int begin = get_global_id(1) * rows_per_item; \
    const int end = begin + rows_per_item < rows ? begin + rows_per_item : rows; \
    const long plane = get_global_id(2); \
    const long image = plane / channels; \
    const int channel = (int)(plane - image * channels);

/* The output columns of a row whose every tap reads inside the input row: [*lo, *hi), and the strips
   of VW that cover them (none when fewer than VW: those columns then go as borders). */
inline void interior(const int W, const int Q, const int PW, int* lo, int* hi, int* strips)
{
    const int last = W - 1 + PW - ${(S - 1) * DW};   /* q·SW may be at most this */
    *lo = PW > 0 ? (PW + ${SW - 1}) / ${SW} : 0;
    if (*lo > Q) *lo = Q;
    *hi = last < 0 ? *lo : last / ${SW} + 1;
    if (*hi > Q) *hi = Q;
    if (*hi < *lo) *hi = *lo;
    *strips = *hi - *lo >= ${VW} ? (*hi - *lo + ${VW - 1}) / ${VW} : 0;
}

/* Element i of a tensor of n elements, or the nearest one that exists */
inline long clamp_index(const long i, const long n)
{
    return i < 0 ? 0 : (i < n ? i : n - 1);
}

/* Border column b of a row (0 ≤ b < Q − interior columns covered by strips) as an output column. */
inline int border_column(const int b, const int lo, const int hi, const int strips)
{
    return strips == 0 || b < lo ? b : b + (hi - lo);
}

% if KERNEL == 'forward':
% if VW > 1:
/* Vectorized by hand: the hint keeps a compiler that vectorizes across work-items (Intel's) to the
   vectors as written */
__attribute__((vec_type_hint(${VT})))
% endif
__kernel void depthwise_forward(
    __global const ${T}* x, const long x_off,
    __global const ${T}* w, const long w_off,
    __global ${T}* y, const long y_off,
    __global const ${T}* bias, const long bias_off,
    __global const ${T}* residual, const long residual_off,
    const int C, const int H, const int W, const int K, const int P, const int Q,
    const int PH, const int PW, const int rows_per_item, const long x_elems)
{
    GROUP_OF_ROWS(p_begin, p_end, P, n, k, K)
    __global ${T}* yp = y + y_off + plane * (long)P * Q;
% if FLIP:
    /* backward_data of a stride-1 layer: output plane (n, k) sums the M = C / K input planes of the
       output gradient's channels k·M + j, each convolved with its channel's flipped weight */
% if MULT:
    const int M = ${MULT};
% else:
    const int M = C / K;
% endif
    __global const ${T}* xn = x + x_off + (n * C + (long)k * M) * (long)H * W;
    __global const ${T}* wn = w + w_off + (long)k * M * ${R * S};
% if MULT:
    ${T} flipped[${MULT}][${R * S}];   /* constant indices once the loops unroll: registers */
    for (int j = 0; j < ${MULT}; ++j) {
% for r, s in TAPS:
        flipped[j][${r * S + s}] = wn[j * ${R * S} + ${(R - 1 - r) * S + S - 1 - s}];
% endfor
    }
% endif
% else:
    __global const ${T}* xp = x + x_off + (n * C + k / (K / C)) * (long)H * W;
    __global const ${T}* wk = w + w_off + (long)k * ${R * S};
% for r, s in TAPS:
    const ${T} w${r}_${s} = wk[${r * S + s}];
% endfor
% endif
% if BIAS:
    const ${T} shift = bias[bias_off + k];
% endif
% if RESIDUAL:
    __global const ${T}* rp = residual + residual_off + plane * (long)P * Q;
% endif
% if WHOLE_ROWS:
    /* Rows of Q ≤ VW outputs: one vector per row, its lanes from Q on idle. Lane l of tap s reads input
       column l·SW − PW + s·DW, which is inside the row for the same lanes on every row (column_inside):
       the taps of one s sum first and the sum is masked once, so the other lanes' loads (the row before
       or after, or the padding) never count. The loads stay inside the input tensor (x_elems elements):
       only a row at its very start or end gathers them from clamped addresses. A row stores its
       whole vector, whose idle lanes land on the next row, written after it by this work-item; the
       run's last row stores its Q lanes alone. */
    const ${IT} lane_column = (${IT})(${", ".join(str(l) for l in range(VW))}) * ${SW};
% for s in range(S):
    const ${IT} column_inside${s} = (lane_column >= PW - ${s * DW}) & (lane_column < W + PW - ${s * DW});
% endfor
    for (int p = p_begin; p < p_end; ++p) {
% for s in range(S):
        ${VT} column_acc${s} = (${VT})(${ZERO});
% endfor
${sources_open()}
% for r in range(R):
        {
            const int h = p * ${SH} - PH + ${r * DH};
            if (INSIDE(h, H)) {
                __global const ${T}* row = xp + (long)h * W - PW;
                const long row_at = row - (x + x_off);
                if (row_at >= 0 && row_at + ${(VW - 1) * SW + (S - 1) * DW} < x_elems) {
% for s in range(S):
                    column_acc${s} = ${strip_tap(s)} * ${weight(r, s)} + column_acc${s};
% endfor
                } else {
% for s in range(S):
                    column_acc${s} = ${vector(T, VW, ["x[x_off + clamp_index(row_at + %d, x_elems)]" % (l * SW + s * DW) for l in range(VW)])} * ${weight(r, s)} + column_acc${s};
% endfor
                }
            }
        }
% endfor
${sources_close()}
        ${VT} acc = (${VT})(${ZERO});
% for s in range(S):
        acc += column_inside${s} ? column_acc${s} : (${VT})(${ZERO});
% endfor
        ${epilogue("acc", VT, vector(T, VW, ["rp[(long)p * Q + (%d < Q ? %d : Q - 1)]" % (l, l) for l in range(VW)]))}
        __global ${T}* out = yp + (long)p * Q;
        if (p + 1 < p_end) {
            ${store_contiguous("out", "acc")}
        } else {
% for l in range(VW):
            if (${l} < Q) out[${l}] = ${lane("acc", VW, l)};
% endfor
        }
    }
% else:
    int lo, hi, strips;
    interior(W, Q, PW, &lo, &hi, &strips);
% if EDGE_STRIPS and VW > 1:
    /* Strips over whole rows when every load of the edge strips stays inside the input tensor: they read
       at most PW elements before a row and past its end into the row before or after, which exist for
       every plane but the tensor's first and last (those take the border columns). */
% if FLIP:
    const long plane_at = xn - (x + x_off), plane_elems = (long)M * H * W;
% else:
    const long plane_at = xp - (x + x_off), plane_elems = (long)H * W;
% endif
    const int past_row = (Q - 1) * ${SW} - PW + ${(S - 1) * DW} - (W - 1);
    const int row_strips = Q >= ${VW} ? (Q + ${VW - 1}) / ${VW} : 0;
    const bool edge_strips = row_strips > 0 && plane_at >= (PW > 0 ? PW : 0)
                             && plane_at + plane_elems + (past_row > 0 ? past_row : 0) <= x_elems;
    const int borders = edge_strips ? 0 : Q - (strips ? hi - lo : 0);
    const ${IT} lane_index = (${IT})(${", ".join(str(l) for l in range(VW))});
    if (edge_strips) {
        ${row_loops(True)}
    } else {
        ${row_loops(False)}
    }
% else:
    const int borders = Q - (strips ? hi - lo : 0);
    ${row_loops(False)}
% endif
    /* Border columns, one at a time down the run: which of a column's taps fall outside the row is the
       same on every row, so it is decided once (their loads clamped into the row, their weights zero). */
    for (int b = lane; b < borders; b += lanes) {
        const int q = border_column(b, lo, hi, strips);
% for s in range(S):
        const bool in${s} = INSIDE(q * ${SW} - PW + ${s * DW}, W);
        const int at${s} = in${s} ? q * ${SW} - PW + ${s * DW} : 0;
% endfor
        for (int p = p_begin; p < p_end; ++p) {
            ${T} acc = ${ZERO};
${sources_open()}
% for r in range(R):
            {
                const int h = p * ${SH} - PH + ${r * DH};
                if (INSIDE(h, H)) {
                    __global const ${T}* row = xp + (long)h * W;
% for s in range(S):
                    acc = row[at${s}] * (in${s} ? ${weight(r, s)} : ${ZERO}) + acc;
% endfor
                }
            }
% endfor
${sources_close()}
            ${epilogue("acc", T, "rp[(long)p * Q + q]")}
            yp[(long)p * Q + q] = acc;
        }
    }
% endif
}

% elif KERNEL == 'backward_data':
__kernel void depthwise_backward_data(
    __global const ${T}* gy, const long gy_off,
    __global const ${T}* w, const long w_off,
    __global ${T}* gx, const long gx_off,
    const int C, const int H, const int W, const int K, const int P, const int Q,
    const int PH, const int PW, const int rows_per_item)
{
    GROUP_OF_ROWS(h_begin, h_end, H, n, c, C)
    const int M = K / C;
    __global ${T}* gxp = gx + gx_off + plane * (long)H * W;
    __global const ${T}* gyn = gy + gy_off + (n * K + (long)c * M) * P * Q;
    __global const ${T}* wc = w + w_off + (long)c * M * ${R * S};
    for (int phase = 0; phase < ${SW} && phase < W; ++phase) {
        /* columns v = phase + SW·i, i < count; tap s serves them when SW divides phase + PW − s·DW and
           then reads gy column i + o_s. The interior: every serving tap's column inside [0, Q). */
        const int count = (W - phase + ${SW - 1}) / ${SW};
        int lo = 0, hi = count;
% for s in range(S):
        const int offset${s} = phase + PW - ${s * DW};
        const bool serves${s} = offset${s} % ${SW} == 0;
        const int o${s} = offset${s} / ${SW};
        if (serves${s}) {
            if (-o${s} > lo) lo = -o${s};
            if (Q - o${s} < hi) hi = Q - o${s};
        }
% endfor
        if (lo > count) lo = count;
        if (hi < lo) hi = lo;
        const int strips = hi - lo >= ${VW} ? (hi - lo + ${VW - 1}) / ${VW} : 0;
        const int borders = count - (strips ? hi - lo : 0);
        for (int h = h_begin; h < h_end; ++h) {
            __global ${T}* out = gxp + (long)h * W + phase;
            for (int t = lane; t < strips; t += lanes) {
                const int i0 = lo + t * ${VW} < hi - ${VW} ? lo + t * ${VW} : hi - ${VW};
                ${VT} acc = (${VT})(${ZERO});
                for (int j = 0; j < M; ++j) {
% for r in range(R):
                    ${gradient_row(r, "i0")}
% for s in range(S):
                            if (serves${s}) {
                                __global const ${T}* tap = row + o${s};
                                acc = ${contiguous("tap")} * wc[j * ${R * S} + ${r * S + s}] + acc;
                            }
% endfor
                        }
                    }
% endfor
                }
                __global ${T}* strip = out + i0 * ${SW};
% if SW == 1:
                ${store_contiguous("strip", "acc")}
% else:
% for l in range(VW):
                strip[${l * SW}] = ${lane("acc", VW, l)};
% endfor
% endif
            }
            for (int b = lane; b < borders; b += lanes) {
                const int i = border_column(b, lo, hi, strips);
                ${T} acc = 0;
                for (int j = 0; j < M; ++j) {
% for r in range(R):
                    ${gradient_row(r, "0")}
% for s in range(S):
                            if (serves${s} && INSIDE(i + o${s}, Q)) acc = row[i + o${s}] * wc[j * ${R * S} + ${r * S + s}] + acc;
% endfor
                        }
                    }
% endfor
                }
                out[i * ${SW}] = acc;
            }
        }
    }
}

% else:
__kernel void depthwise_weight_partial(
    __global const ${T}* x, const long x_off,
    __global const ${T}* gy, const long gy_off,
    __global ${T}* part, const long part_off,
    const int C, const int H, const int W, const int K, const int P, const int Q,
    const int PH, const int PW, const int rows_per_chunk, const int N)
{
    const int lane = get_local_id(0), lanes = get_local_size(0);
    const int chunk = get_global_id(1);
    const int k = get_global_id(2);
    const int c = k / (K / C);
    const int first = chunk * rows_per_chunk;
    const int last = first + rows_per_chunk < N * P ? first + rows_per_chunk : N * P;
    int lo, hi, strips;
    interior(W, Q, PW, &lo, &hi, &strips);
    const int borders = Q - (strips ? hi - lo : 0);
% if VW > 1:
    const ${IT} vector_lane = (${IT})(${", ".join(str(l) for l in range(VW))});
% endif
% for r, s in TAPS:
    ${VT} acc${r}_${s} = (${VT})(${ZERO});
% if VW > 1:
    ${T} border${r}_${s} = 0;
% endif
% endfor
    for (int i = first; i < last; ++i) {
        const int n = i / P, p = i - n * P;
        __global const ${T}* gyrow = gy + gy_off + ((long)(n * K + k) * P + p) * Q;
        __global const ${T}* xp = x + x_off + (long)(n * C + c) * H * W;
% for r in range(R):
        const int h${r} = p * ${SH} - PH + ${r * DH};
% endfor
        for (int t = lane; t < strips; t += lanes) {
            const int q = lo + t * ${VW};
            const int q0 = q < hi - ${VW} ? q : hi - ${VW};
            __global const ${T}* gstrip = gyrow + q0;
            ${VT} g = ${contiguous("gstrip")};
% if VW > 1:
            if (q0 < q) g = vector_lane >= (${IT})(q - q0) ? g : (${VT})(${ZERO});   /* counted by the strip before */
% endif
% for r in range(R):
            if (INSIDE(h${r}, H)) {
                __global const ${T}* row = xp + (long)h${r} * W + q0 * ${SW} - PW;
% for s in range(S):
                acc${r}_${s} = g * ${strip_tap(s) if SW == 1 else vector(T, VW, ["row[%d]" % (l * SW + s * DW) for l in range(VW)])} + acc${r}_${s};
% endfor
            }
% endfor
        }
        for (int b = lane; b < borders; b += lanes) {
            const int q = border_column(b, lo, hi, strips);
            const ${T} g = gyrow[q];
% for r in range(R):
            if (INSIDE(h${r}, H)) {
                __global const ${T}* row = xp + (long)h${r} * W;
% for s in range(S):
                if (INSIDE(q * ${SW} - PW + ${s * DW}, W))
                    ${"border%d_%d" % (r, s) if VW > 1 else "acc%d_%d" % (r, s)} = g * row[q * ${SW} - PW + ${s * DW}] + ${"border%d_%d" % (r, s) if VW > 1 else "acc%d_%d" % (r, s)};
% endfor
            }
% endfor
        }
    }
    const long all_lanes = (long)lanes * ${VW};
    __global ${T}* out = part + part_off + ((long)k * ${R * S} * get_global_size(1) + chunk) * all_lanes + lane * ${VW};
% for r, s in TAPS:
    {
% if VW > 1:
        const ${VT} sum = acc${r}_${s} + (${VT})(${", ".join(["border%d_%d" % (r, s)] + [ZERO] * (VW - 1))});
% else:
        const ${T} sum = acc${r}_${s};
% endif
        ${store_contiguous("out + %d * get_global_size(1) * all_lanes" % (r * S + s), "sum")}
    }
% endfor
}
% endif
