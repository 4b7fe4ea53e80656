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

/* The hash's part that depends on (seed, stream) alone: made once for a run of indices. */
static uint64_t stream_key(uint64_t seed, uint64_t stream) {
    return mix64(mix64(seed + 0x9e3779b97f4a7c15ULL) ^ (stream * 0xd6e8feb86659fd93ULL));
}

static uint64_t hash_at(uint64_t key, uint64_t index) {
    return mix64(key ^ (index + 0x632be59bd9b4e019ULL));
}

/* 53 random bits, shifted by half a step so neither end is reached. */
static double uniform_at(uint64_t key, uint64_t index) {
    return ((double)(hash_at(key, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

static float normal_at(uint64_t key, uint64_t index) {
    double u1 = uniform_at(key, 2 * index);
    double u2 = uniform_at(key, 2 * index + 1);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

uint64_t rng_hash(uint64_t seed, uint64_t stream, uint64_t index) {
    return hash_at(stream_key(seed, stream), index);
}

double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return uniform_at(stream_key(seed, stream), index);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index) {
    return normal_at(stream_key(seed, stream), index);
}

void rng_normals(uint64_t seed, uint64_t stream, uint64_t first, size_t n, float scale,
                 float *out) {
    const uint64_t key = stream_key(seed, stream);
    for (size_t k = 0; k < n; k++) out[k] = scale * normal_at(key, first + k);
}
