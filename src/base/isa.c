/* The instruction-set switch: detection once, NANOLM_ISA read once (see nanolm/isa.h). */
#include "nanolm/isa.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#endif

static const char *const names[NL_ISA_COUNT] = {"scalar", "avx2", "avx512", "neon"};

const char *nl_isa_name(nl_isa isa) { return (unsigned)isa < NL_ISA_COUNT ? names[isa] : "?"; }

static nl_isa detect(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    unsigned a, b, c, d;
    /* F16C from CPUID leaf 1 (ECX bit 29): clang before 16 has no "f16c" in __builtin_cpu_supports */
    const int f16c = __get_cpuid(1, &a, &b, &c, &d) && ((c >> 29) & 1u);
    if (!avx2 || !f16c) return NL_ISA_SCALAR;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq"))
        return NL_ISA_AVX512;
    return NL_ISA_AVX2;
#elif defined(__aarch64__)
#if defined(__linux__)
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) ? NL_ISA_NEON : NL_ISA_SCALAR;
#else
    return NL_ISA_NEON; /* Advanced SIMD is mandatory on AArch64 */
#endif
#else
    return NL_ISA_SCALAR;
#endif
}

nl_status nl_isa_parse(const char *s, nl_isa *out) {
    if (s && !strcasecmp(s, "auto")) {
        *out = nl_isa_detected();
        return NL_OK;
    }
    for (int i = 0; i < NL_ISA_COUNT; i++)
        if (s && !strcasecmp(s, names[i])) {
            *out = (nl_isa)i;
            return NL_OK;
        }
    return nl_fail(NL_ERR_INVALID, "unknown instruction set '%s' (known: auto, avx512, avx2, neon, scalar)",
                   s ? s : "(null)");
}

static nl_isa detected, env_cap;
static int env_bad;
static char env_value[64];
static volatile int cap_override = -1; /* nl_isa_set_cap; -1: NANOLM_ISA's */
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    detected = detect();
    env_cap = detected;
    const char *v = getenv("NANOLM_ISA");
    if (!v || !*v) return;
    snprintf(env_value, sizeof env_value, "%s", v);
    if (!strcasecmp(v, "auto")) return;
    env_bad = 1;
    for (int i = 0; i < NL_ISA_COUNT; i++)
        if (!strcasecmp(v, names[i])) {
            env_cap = (nl_isa)i;
            env_bad = 0;
        }
    if (env_bad) env_cap = NL_ISA_SCALAR;
}

nl_isa nl_isa_detected(void) {
    pthread_once(&once, init);
    return detected;
}

/* x86 sets are ordered (scalar < avx2 < avx512); neon is its own family above scalar. */
static int allows(nl_isa cap, nl_isa isa) {
    if (isa == NL_ISA_SCALAR) return 1;
    if (isa == NL_ISA_NEON || cap == NL_ISA_NEON) return cap == isa;
    return isa <= cap;
}

nl_isa nl_isa_active(void) {
    pthread_once(&once, init);
    const nl_isa cap = cap_override >= 0 ? (nl_isa)cap_override : env_cap;
    for (int i = NL_ISA_COUNT - 1; i > 0; i--)
        if (allows(detected, (nl_isa)i) && allows(cap, (nl_isa)i)) return (nl_isa)i;
    return NL_ISA_SCALAR;
}

int nl_isa_has(nl_isa isa) {
    if ((unsigned)isa >= NL_ISA_COUNT) return 0;
    return allows(nl_isa_active(), isa);
}

int nl_isa_has_ext(const char *ext) {
    if (!ext) return 0;
#if defined(__x86_64__) || defined(__i386__)
    if (!strcmp(ext, "avx512vnni")) return nl_isa_has(NL_ISA_AVX512) && __builtin_cpu_supports("avx512vnni");
    if (!strcmp(ext, "avx512bf16")) return nl_isa_has(NL_ISA_AVX512) && __builtin_cpu_supports("avx512bf16");
    if (!strcmp(ext, "avxvnni")) {
        unsigned a, b, c, d; /* CPUID.(7,1):EAX bit 4 */
        return nl_isa_has(NL_ISA_AVX2) && __get_cpuid_count(7, 1, &a, &b, &c, &d) && ((a >> 4) & 1u);
    }
#elif defined(__aarch64__) && defined(__linux__)
    if (!strcmp(ext, "dotprod")) return nl_isa_has(NL_ISA_NEON) && (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
    return 0;
}

nl_status nl_isa_check_env(void) {
    pthread_once(&once, init);
    if (env_bad)
        return nl_fail(NL_ERR_INVALID,
                       "NANOLM_ISA='%s' names no instruction set (known: auto, avx512, avx2, neon, scalar)", env_value);
    return NL_OK;
}

void nl_isa_set_cap(nl_isa cap) {
    pthread_once(&once, init);
    cap_override = (unsigned)cap < NL_ISA_COUNT ? (int)cap : -1;
}
