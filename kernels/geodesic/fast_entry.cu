// fusekit geodesic kernels: a fast module's entry points, its tile's kernels
// (GEO_CFG_RP, GEO_CFG_DJ): the FFMA kernel and, in the f32 forwards' modules
// (GEO_TF32), the TF32 variants.

// Threads per block of the FFMA fast kernels (the TF32 ones: GEO_FAST_NT).
#define GEO_SIMT_NT GEO_NT

// The FFMA kernel, GEO_MB rows per thread (a stub where its shared memory exceeds
// GEO_SMEM_MAX: never chosen by the host).
#define GEO_ENTRY(NAME, FN, RP, DJ)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEO_SIMT_NT, 1) GEO_NAME(geo_##NAME##_r##RP##_d##DJ)(const GeoArgs a) {  \
        typedef Cfg<GEO_T, RP, DJ, GEO_MB> C;                                                                 \
        if constexpr (GEO_SMEM <= GEO_SMEM_MAX) FN<C>(a);                                                     \
        else __trap();                                                                                         \
    }
// TF32 variants (GEO_TF32: f32 modules of the forwards): geo_<op>_tc_r<RP>_d<DJ>_f32,
// stubs for DJ = 16.
#define GEO_ENTRY_TC(NAME, FN, RP, DJ)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) GEO_NAME(geo_##NAME##_tc_r##RP##_d##DJ)(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), GEO_TC_MB, true> C;                                     \
        if constexpr ((DJ) <= 8 && GEO_SMEM_TC <= GEO_SMEM_MAX) FN<C>(a);                                      \
        else __trap();                                                                                         \
    }
// 3xTF32 (the leapfrog forward's TF32 module): geo_lf_fwd_tc3_r<RP>_d<DJ>_f32
#define GEO_ENTRY_TC3(NAME, FN, RP, DJ)                                                                              \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) GEO_NAME(geo_##NAME##_tc3_r##RP##_d##DJ)(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), GEO_TC_MB, true, true> C;                                \
        if constexpr ((DJ) <= 8 && GEO_SMEM_TC3 <= GEO_SMEM_MAX) FN<C>(a);                                      \
        else __trap();                                                                                          \
    }
#if defined(GEO_TF32) && defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST_TC(RP, DJ) GEO_ENTRY_TC(chr_fwd, chr_fwd_fast, RP, DJ)
#elif defined(GEO_TF32) && defined(GEO_MODULE_LF_FWD)
#define GEO_FAST_TC(RP, DJ) GEO_ENTRY_TC(lf_fwd, lf_fwd_fast, RP, DJ) GEO_ENTRY_TC3(lf_fwd, lf_fwd_fast, RP, DJ)
#else
#define GEO_FAST_TC(RP, DJ)
#endif
#if defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_fwd, chr_fwd_fast, RP, DJ)
#elif defined(GEO_MODULE_CHR_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_bwd, chr_bwd_fast, RP, DJ)
#elif defined(GEO_MODULE_LF_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_fwd, lf_fwd_fast, RP, DJ)
#elif defined(GEO_MODULE_LF_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_bwd, lf_bwd_fast, RP, DJ)
#endif
#define GEO_FAST_EXPAND(RP, DJ) GEO_FAST(RP, DJ) GEO_FAST_TC(RP, DJ)

GEO_FAST_EXPAND(GEO_CFG_RP, GEO_CFG_DJ)
