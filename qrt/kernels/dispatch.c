/* Which kernel variants this build holds, which this CPU can run, and the best of them. */
#define _GNU_SOURCE /* syscall() */
#include "qrt_kernels.h"

#include <string.h>
#if defined(QRT_HAVE_AMX)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>

extern const qrt_kernels qrt_kernels_avx512_vnni, qrt_kernels_avx_vnni, qrt_kernels_avx2;

/* F16C (cpuid leaf 1, ecx bit 29) and AVX-VNNI (leaf 7 subleaf 1, eax bit 4): not every compiler's
 * __builtin_cpu_supports knows their names */
static int has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29)) != 0;
}
static int has_avx_vnni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 4)) != 0;
}
#endif
#if defined(QRT_HAVE_AMX)
extern const qrt_kernels qrt_kernels_amx_int8;

/* AMX-TILE and AMX-INT8 (cpuid leaf 7, edx bits 24 and 25), the tile state enabled by the OS (XCR0 bits 17
 * and 18, read once OSXSAVE says xgetbv may be), and this process's permission to use it, which Linux grants
 * on request, once for every thread (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA; a kernel before
 * 5.16 refuses). Asked once: the answer does not change. */
static int has_amx_int8(void) {
    static int known = -1;
    if (known < 0) {
        unsigned a, b, c, d, lo, hi;
        int ok = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (3u << 24)) == (3u << 24) &&
                 __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 27)) != 0;
        if (ok) {
            __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ok = (lo & (3u << 17)) == (3u << 17) && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                                                            18 /* XFEATURE_XTILEDATA */) == 0;
        }
        known = ok;
    }
    return known;
}
#endif
#if defined(__aarch64__)
extern const qrt_kernels qrt_kernels_neon;
#endif
#if defined(QRT_HAVE_NEON_DOTPROD)
extern const qrt_kernels qrt_kernels_neon_dotprod;
#endif
extern const qrt_kernels qrt_kernels_portable;

static const qrt_kernels* const compiled[] = {
#if defined(QRT_HAVE_AMX)
    &qrt_kernels_amx_int8,
#endif
#if defined(__x86_64__) || defined(_M_X64)
    &qrt_kernels_avx512_vnni, &qrt_kernels_avx_vnni, &qrt_kernels_avx2,
#endif
#if defined(QRT_HAVE_NEON_DOTPROD)
    &qrt_kernels_neon_dotprod,
#endif
#if defined(__aarch64__)
    &qrt_kernels_neon,
#endif
    &qrt_kernels_portable,
};

const qrt_kernels* const* qrt_kernels_compiled(int* count) {
    *count = (int)(sizeof compiled / sizeof compiled[0]);
    return compiled;
}

int qrt_kernels_runnable(const qrt_kernels* k) {
#if defined(__x86_64__) || defined(_M_X64)
    /* __builtin_cpu_supports also checks that the OS saves the vector registers (xgetbv) */
    __builtin_cpu_init();
#if defined(QRT_HAVE_AMX)
    if (k == &qrt_kernels_amx_int8) /* avx512-vnni's instructions, and the tiles */
        return qrt_kernels_runnable(&qrt_kernels_avx512_vnni) && has_amx_int8();
#endif
    if (k == &qrt_kernels_avx512_vnni)
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("fma") && has_f16c();
    if (k == &qrt_kernels_avx_vnni) /* the ymm state is the OS's to save: avx2 checks that */
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c() && has_avx_vnni();
    if (k == &qrt_kernels_avx2)
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
#endif
#if defined(QRT_HAVE_NEON_DOTPROD)
    if (k == &qrt_kernels_neon_dotprod) {
#if defined(__linux__)
        return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#else
        return 0;
#endif
    }
#endif
    return 1; /* portable C, and ARMv8.0 NEON, which every aarch64 core has */
}

const qrt_kernels* qrt_kernels_best(void) {
    int n;
    const qrt_kernels* const* all = qrt_kernels_compiled(&n);
    for (int i = 0; i < n; i++)
        if (qrt_kernels_runnable(all[i]))
            return all[i];
    return &qrt_kernels_portable;
}

/* Widening float16 weights once for the row tiles that share them pays where converting them on every tile is
 * dear: in portable C (a conversion in software), and on Intel x86, whose conversions issue on the ports of
 * its fma (Emerald Rapids, 32 rows and more: avx512-vnni 1.03-1.27x, avx2 0.98-1.09x). On AMD x86 they have
 * pipes of their own, and a scheme of the same kind ran slower on Zen 5; ARM: not measured. */
ptrdiff_t qrt_fp_widen_default(const qrt_kernels* k) {
    if (k == &qrt_kernels_portable)
        return QRT_F16_WIDEN_MAX;
#if defined(__x86_64__) || defined(_M_X64)
    unsigned a, b, c, d; /* the vendor string of leaf 0: "Genu" "ineI" "ntel" in ebx, edx, ecx */
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u && d == 0x49656e69u && c == 0x6c65746eu)
        return QRT_F16_WIDEN_MAX;
#endif
    return 0;
}

const qrt_kernels* qrt_kernels_named(const char* name) {
    int n;
    const qrt_kernels* const* all = qrt_kernels_compiled(&n);
    for (int i = 0; i < n; i++)
        if (strcmp(all[i]->name, name) == 0)
            return qrt_kernels_runnable(all[i]) ? all[i] : NULL;
    return NULL;
}
