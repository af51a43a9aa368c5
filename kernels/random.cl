<%doc>
Counter-based random numbers: element i of stream `seed` is a pure function of (seed, i), so results
do not depend on the launch geometry or the device, and a seeded run replays exactly.
The generator is a 4-round integer hash (a SplitMix64-style finalizer) of (seed, counter).

Template parameters (all have defaults):
  T           C type of the output            (default "float")
  DIST        "uniform" [0,1) | "normal" (Box-Muller) | "bernoulli_keep" (1/(1-p) with prob 1-p, else 0)
                                              (default "uniform")
</%doc>
<%page args="T='float', DIST='uniform'"/>
<%! from netcl.runtime.cl_guards import beyond %>
% if T == 'double':
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
% endif

inline ulong mix64(ulong z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9UL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebUL;
    return z ^ (z >> 31);
}

/* 24 random bits -> a float in [0, 1) that is exactly representable in float32. */
inline float unit_float(ulong bits) { return (float)(bits >> 40) * (1.0f / 16777216.0f); }

__kernel void fill_random(__global ${T}* out, const long out_off, const ulong seed, const long n, const ${T} p)
{
    const long i = get_global_id(0);
    if (${beyond('i', 'n')}) return;
    const ulong h = mix64(seed * 0x9e3779b97f4a7c15UL + mix64((ulong) i + 0x632be59bd9b4e019UL));
% if DIST == 'uniform':
    out[out_off + i] = (${T}) unit_float(h);
% elif DIST == 'normal':
    const float u1 = 1.0f - unit_float(h);           /* (0, 1]: log is finite */
    const float u2 = unit_float(mix64(h ^ 0xd1b54a32d192ed03UL));
    out[out_off + i] = (${T}) (sqrt(-2.0f * log(u1)) * cos(6.283185307179586f * u2));
% else:
    out[out_off + i] = unit_float(h) >= (float) p ? (${T}) 1 / ((${T}) 1 - p) : (${T}) 0;
% endif
}
