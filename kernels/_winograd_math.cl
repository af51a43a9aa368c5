<%doc>
The three transforms of Winograd F(2x2, 3x3) (Lavin & Gray), stated once for every kernel that applies
them (kernels/winograd.cl, kernels/winograd_plane.cl). A library of Mako defs (the leading underscore
says so): it emits no code of its own; a kernel template imports it with
<%namespace name="wm" file="_winograd_math.cl"/> and calls a def where the transform goes. Each def opens
a C block holding its temporaries, so it can be used several times in one function, and hands every
result element to the caller's `store`, a Python function (i, j, value) returning the C statement that
stores `value` (a C expression) as element (i, j), or "" to drop it. i is a C loop variable or a Python
int, as each def says; j is always a Python int. The scalar, 4-lane and 8-lane forms thus evaluate the
same expressions in the same order, which is what makes the whole-plane kernels bit-identical to the
tile kernels (tests/test_conv_winograd.py checks it).

  input_transform(VT, d, store)      B^T d B of the 4x4 tile d (a C array d[4][4] of VT): store(i, j, v)
                                     for i a C variable 0..3
  filter_transform(VT, T, g, store)  G g G^T of the 3x3 filter g (C array g[3][3] of VT): store(r, j, v)
                                     for r a C variable 0..3
  output_transform(VT, m, store)     A^T m A of the 4x4 product m (C array m[4][4] of VT): store(i, j, v)
                                     for i, j Python ints 0..1 (the caller drops what falls off the output)

with B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1],
A^T = [1 1 1 0; 0 1 -1 -1]. VT is the value type (T, T4, T8), T its scalar type.

Template parameters: none (each def takes what it needs).
</%doc>

<%def name="input_transform(VT, d, store)">\
    {
        ${VT} bt_d[4][4];
        for (int j = 0; j < 4; ++j) {
            bt_d[0][j] = ${d}[0][j] - ${d}[2][j];
            bt_d[1][j] = ${d}[1][j] + ${d}[2][j];
            bt_d[2][j] = ${d}[2][j] - ${d}[1][j];
            bt_d[3][j] = ${d}[1][j] - ${d}[3][j];
        }
        for (int i = 0; i < 4; ++i) {
            ${store("i", 0, "bt_d[i][0] - bt_d[i][2]")};
            ${store("i", 1, "bt_d[i][1] + bt_d[i][2]")};
            ${store("i", 2, "bt_d[i][2] - bt_d[i][1]")};
            ${store("i", 3, "bt_d[i][1] - bt_d[i][3]")};
        }
    }
</%def>

<%def name="filter_transform(VT, T, g, store)">\
    {
        const ${T} hf = (${T})0.5;
        ${VT} g_g[4][3];
        for (int j = 0; j < 3; ++j) {
            g_g[0][j] = ${g}[0][j];
            g_g[1][j] = hf * (${g}[0][j] + ${g}[1][j] + ${g}[2][j]);
            g_g[2][j] = hf * (${g}[0][j] - ${g}[1][j] + ${g}[2][j]);
            g_g[3][j] = ${g}[2][j];
        }
        for (int r = 0; r < 4; ++r) {
            ${store("r", 0, "g_g[r][0]")};
            ${store("r", 1, "hf * (g_g[r][0] + g_g[r][1] + g_g[r][2])")};
            ${store("r", 2, "hf * (g_g[r][0] - g_g[r][1] + g_g[r][2])")};
            ${store("r", 3, "g_g[r][2]")};
        }
    }
</%def>

<%def name="output_transform(VT, m, store)">\
    {
        ${VT} at_m[2][4];
        for (int j = 0; j < 4; ++j) {
            at_m[0][j] = ${m}[0][j] + ${m}[1][j] + ${m}[2][j];
            at_m[1][j] = ${m}[1][j] - ${m}[2][j] - ${m}[3][j];
        }
% for i in range(2):
        ${store(i, 0, f"at_m[{i}][0] + at_m[{i}][1] + at_m[{i}][2]")};
        ${store(i, 1, f"at_m[{i}][1] - at_m[{i}][2] - at_m[{i}][3]")};
% endfor
    }
</%def>
