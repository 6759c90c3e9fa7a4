// fusekit geodesic kernels: a fast module's entry points, its tile's kernels
// (GEO_CFG_RP, GEO_CFG_DJ): the FFMA kernel and, in the f32 forwards' modules
// (GEO_TF32), the TF32 variants.

// Rows per thread of the fast kernels: forwards and the Christoffel backward use
// tiles of 16 rows (8 for DJ = 16); the leapfrog backward, which also keeps its
// adjoints and the dU, dW accumulators in registers, half of that.
#define GEO_MB_A(DJ) ((DJ) <= 8 ? 4 : 2)
#define GEO_MB_B(DJ) ((DJ) <= 8 ? 2 : 1)
// The FFMA Christoffel forward: tiles of 32 rows (16 for DJ = 16), one group of GEO_NT.
#define GEO_MB_CF(DJ) ((DJ) <= 8 ? 8 : 4)
// Threads per block of the FFMA fast kernels (the TF32 ones: GEO_FAST_NT).
#define GEO_SIMT_NT GEO_NT

#define GEO_ENTRY(NAME, FN, SMEM, MBX, RP, DJ)                                                                   \
    extern "C" __global__ void __launch_bounds__(GEO_SIMT_NT, 1) geo_##NAME##_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<GEO_T, RP, DJ, MBX(DJ)> C;                                                            \
        if constexpr (C::SMEM * sizeof(GEO_T) <= GEO_SMEM_MAX) FN<C>(a);                                  \
        else __trap();                                                                                     \
    }
// TF32 variants (GEO_TF32: f32 modules of the forwards): geo_<op>_tc_r<RP>_d<DJ>,
// stubs for DJ = 16.
#define GEO_ENTRY_TC(NAME, FN, SMEM, RP, DJ)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) geo_##NAME##_tc_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), 4, true> C;                                           \
        if constexpr ((DJ) <= 8 && C::SMEM * sizeof(float) <= GEO_SMEM_MAX) FN<C>(a);                         \
        else __trap();                                                                                         \
    }
// 3xTF32 (the leapfrog forward's TF32 module): geo_lf_fwd_tc3_r<RP>_d<DJ>
#define GEO_ENTRY_TC3(NAME, FN, SMEM, RP, DJ)                                                                        \
    extern "C" __global__ void __launch_bounds__(GEO_FAST_NT, 1) geo_##NAME##_tc3_r##RP##_d##DJ(const GeoArgs a) {  \
        typedef Cfg<float, RP, ((DJ) <= 8 ? (DJ) : 8), 4, true, true> C;                                      \
        if constexpr ((DJ) <= 8 && C::SMEM * sizeof(float) <= GEO_SMEM_MAX) FN<C>(a);                          \
        else __trap();                                                                                          \
    }
#if defined(GEO_TF32) && defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST_TC(RP, DJ) GEO_ENTRY_TC(chr_fwd, chr_fwd_fast, SMEM_CHR_FWD_TC, RP, DJ)
#elif defined(GEO_TF32) && defined(GEO_MODULE_LF_FWD)
#define GEO_FAST_TC(RP, DJ) \
    GEO_ENTRY_TC(lf_fwd, lf_fwd_fast, SMEM_LF_FWD_TC, RP, DJ) GEO_ENTRY_TC3(lf_fwd, lf_fwd_fast, SMEM_LF_FWD_TC3, RP, DJ)
#else
#define GEO_FAST_TC(RP, DJ)
#endif
#if defined(GEO_MODULE_CHR_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_fwd, chr_fwd_fast, SMEM_CHR_FWD, GEO_MB_CF, RP, DJ)
#elif defined(GEO_MODULE_CHR_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(chr_bwd, chr_bwd_fast, SMEM_CHR_BWD, GEO_MB_A, RP, DJ)
#elif defined(GEO_MODULE_LF_FWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_fwd, lf_fwd_fast, SMEM_LF_FWD, GEO_MB_A, RP, DJ)
#elif defined(GEO_MODULE_LF_BWD)
#define GEO_FAST(RP, DJ) GEO_ENTRY(lf_bwd, lf_bwd_fast, SMEM_LF_BWD, GEO_MB_B, RP, DJ)
#endif
#define GEO_FAST_EXPAND(RP, DJ) GEO_FAST(RP, DJ) GEO_FAST_TC(RP, DJ)

GEO_FAST_EXPAND(GEO_CFG_RP, GEO_CFG_DJ)

// The host's plan (src/cuda/geodesic/plan.rs) states the constants above and each
// fast module's tile rows, vector layout and shared memory per variant as GEO_PLAN_*
// (bytes) in the module's source; the kernels' own values (Cfg) must equal them, so
// an NVRTC compile of the module (tests/kernels_compile.rs) fails where the two
// disagree. The CPU emulator (tests/emu) compiles the source without them.
#if defined(GEO_PLAN_NT)
static_assert(GEO_NT == GEO_PLAN_NT && GEO_NW == GEO_PLAN_NW && GEO_GROUPS == GEO_PLAN_GROUPS && GEN_RG == GEO_PLAN_RG &&
                  GEO_SMEM_MAX == GEO_PLAN_SMEM_MAX,
              "the plan's constants");
static_assert(GEO_WANT_DV == GEO_PLAN_WANT_DV && GEO_WANT_DU == GEO_PLAN_WANT_DU && GEO_WANT_DW == GEO_PLAN_WANT_DW &&
                  GEO_WANT_DF == GEO_PLAN_WANT_DF && GEO_WANT_DX == GEO_PLAN_WANT_DX,
              "the plan's GEO_WANT_* bits");
#if defined(GEO_SW_M)
static_assert(GEO_SW_M == GEO_PLAN_SW_M, "the plan's rows per geo_sw tile");
#endif
#if defined(GEO_CFG_RP)
// the FFMA kernel of this module (GEO_FAST's Cfg and SMEM_*)
#if defined(GEO_MODULE_CHR_FWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_CF(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_CHR_FWD
#elif defined(GEO_MODULE_CHR_BWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_A(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_CHR_BWD
#elif defined(GEO_MODULE_LF_FWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_A(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_LF_FWD
#elif defined(GEO_MODULE_LF_BWD)
typedef Cfg<GEO_T, GEO_CFG_RP, GEO_CFG_DJ, GEO_MB_B(GEO_CFG_DJ)> GeoPlanCfg;
#define GEO_PLAN_KERNEL_SMEM GeoPlanCfg::SMEM_LF_BWD
#endif
static_assert(GeoPlanCfg::M == GEO_PLAN_M && GeoPlanCfg::VL == (GEO_PLAN_VL != 0) &&
                  GEO_PLAN_KERNEL_SMEM * sizeof(GEO_T) == GEO_PLAN_SMEM,
              "the plan's FFMA kernel: tile rows, vector layout, shared memory");
// U and W in registers (lf_fwd_rs): exactly where the plan has its size
#if defined(GEO_PLAN_SMEM_RS)
static_assert(GeoPlanCfg::RS && GeoPlanCfg::SMEM_LF_FWD_RS * sizeof(float) == GEO_PLAN_SMEM_RS,
              "the plan's register leapfrog forward");
#else
static_assert(!GeoPlanCfg::RS, "a register leapfrog forward the plan does not know");
#endif
// the TF32 variants (GEO_ENTRY_TC, GEO_ENTRY_TC3): the f32 forwards' modules, DJ <= 8
#if defined(GEO_TF32) && GEO_CFG_DJ <= 8
typedef Cfg<float, GEO_CFG_RP, GEO_CFG_DJ, 4, true> GeoPlanTc;
static_assert(GeoPlanTc::M == GEO_PLAN_TC_M, "the plan's TF32 tile rows");
#if defined(GEO_MODULE_CHR_FWD)
static_assert(GeoPlanTc::SMEM_CHR_FWD_TC * sizeof(float) == GEO_PLAN_SMEM_TC, "the plan's TF32 Christoffel forward");
#if defined(GEO_PLAN_SMEM_STAGE) || defined(GEO_PLAN_SMEM_TC3)
#error "the plan has leapfrog variants in a Christoffel module"
#endif
#else
static_assert(GeoPlanTc::SMEM_LF_FWD_TC * sizeof(float) == GEO_PLAN_SMEM_TC &&
                  GeoPlanTc::SMEM_LF_STAGE * sizeof(float) == GEO_PLAN_SMEM_STAGE &&
                  Cfg<float, GEO_CFG_RP, GEO_CFG_DJ, 4, true, true>::SMEM_LF_FWD_TC3 * sizeof(float) == GEO_PLAN_SMEM_TC3,
              "the plan's TF32, v stage and 3xTF32 leapfrog forward");
#endif
#elif defined(GEO_PLAN_SMEM_TC) || defined(GEO_PLAN_SMEM_STAGE) || defined(GEO_PLAN_SMEM_TC3)
#error "the plan has TF32 variants this module does not hold"
#endif
#endif
#endif
