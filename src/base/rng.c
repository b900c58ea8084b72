/* xoshiro256** (Blackman & Vigna 2018) seeded with splitmix64: deterministic everywhere. */
#include "nanolm/base.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

void nl_rng_seed(nl_rng *r, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&x);
}

uint64_t nl_rng_u64(nl_rng *r) {
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint32_t nl_rng_u32(nl_rng *r) { return (uint32_t)(nl_rng_u64(r) >> 32); }

float nl_rng_float(nl_rng *r) { return (float)(nl_rng_u64(r) >> 40) * 0x1.0p-24f; }

double nl_rng_double(nl_rng *r) { return (double)(nl_rng_u64(r) >> 11) * 0x1.0p-53; }

uint64_t nl_rng_below(nl_rng *r, uint64_t n) {
    if (n == 0) return 0;
    /* Lemire's nearly-divisionless method with rejection for exact uniformity. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t x = nl_rng_u64(r);
        __uint128_t m = (__uint128_t)x * n;
        if ((uint64_t)m >= threshold) return (uint64_t)(m >> 64);
    }
}

double nl_rng_normal(nl_rng *r) {
    double u1 = nl_rng_double(r), u2 = nl_rng_double(r);
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * 3.14159265358979323846 * u2);
}
