#include "rng.h"

#include <math.h>

/* splitmix64's finaliser: a strong 64-bit mix, cheap enough to call per element. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

uint64_t rng_hash(uint64_t seed, uint64_t stream, uint64_t index) {
    uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ULL);
    h = mix64(h ^ (stream * 0xd6e8feb86659fd93ULL));
    return mix64(h ^ (index + 0x632be59bd9b4e019ULL));
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    /* 53 random bits, shifted by half a step so neither end is reached. */
    return ((double)(rng_hash(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    double u1 = rng_uniform(seed, stream, 2 * index);
    double u2 = rng_uniform(seed, stream, 2 * index + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}
