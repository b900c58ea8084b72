/*
 * The instruction sets nanolm's hand-written kernels may use, and the one switch that caps them.
 *
 * Every kernel has a scalar reference and SIMD paths (AVX2, AVX-512, NEON) chosen at run time.
 * NANOLM_ISA=auto|avx512|avx2|neon|scalar caps that choice for the whole library: a kernel's
 * dispatch asks nl_isa_has() and gets "yes" only when the CPU has the set and the cap allows it.
 * The variable is read once, here and nowhere else. A cap above what the CPU has changes
 * nothing (avx512 on an AVX2 CPU runs AVX2); a cap of another family (neon on x86) runs scalar.
 * OpenBLAS keeps its own dispatch, and code the compiler vectorized by itself follows the build's
 * flags (-march=native unless NANOLM_NATIVE=OFF): the cap is about nanolm's own kernels.
 */
#ifndef NANOLM_ISA_H
#define NANOLM_ISA_H

#include "nanolm/base.h"

typedef enum nl_isa {
    NL_ISA_SCALAR = 0, /* portable C */
    NL_ISA_AVX2,       /* x86-64: AVX2 + FMA + F16C */
    NL_ISA_AVX512,     /* x86-64: AVX-512 F + BW + VL + DQ (+ the above) */
    NL_ISA_NEON,       /* aarch64: Advanced SIMD */
    NL_ISA_COUNT
} nl_isa;

/* "scalar", "avx2", "avx512", "neon". */
const char *nl_isa_name(nl_isa isa);
/* Parses one of those names or "auto" (auto: *out = the widest the CPU has). */
nl_status nl_isa_parse(const char *s, nl_isa *out);

/* The widest set this CPU has (ignores the cap). */
nl_isa nl_isa_detected(void);
/* The widest set the kernels use: the detected one under NANOLM_ISA's cap. */
nl_isa nl_isa_active(void);
/* 1 when the kernels may use `isa`: the CPU has it and the cap allows it (scalar: always). */
int nl_isa_has(nl_isa isa);
/* Extensions inside a set, asked of the CPU under the same cap: "avx512vnni", "avx512bf16",
 * "avxvnni" (x86) and "dotprod" (aarch64). 0 for an unknown name. */
int nl_isa_has_ext(const char *ext);

/* NL_OK, or the error for a NANOLM_ISA value that names no set ("auto" and unset are fine).
 * A bad value caps the kernels at scalar (the safe choice) until the program fixes it; the CLI
 * and the Python binding call this first and refuse to run. */
nl_status nl_isa_check_env(void);

/* Sets the cap from the program (tests, benchmarks); NL_ISA_COUNT restores NANOLM_ISA's. */
void nl_isa_set_cap(nl_isa cap);

#endif
