/* Counter-based random numbers: the value for (seed, stream, index) is a pure function
 * of those three numbers, so any shard of a tensor can be initialised on its own and
 * still match the same slice of the whole tensor bit for bit. */
#ifndef RNG_H
#define RNG_H
#include <stddef.h>
#include <stdint.h>

uint64_t rng_hash(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in (0, 1), never exactly 0 or 1. */
double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Standard normal (Box-Muller on two independent uniforms of this index). */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* out[k] = scale * rng_normal(seed, stream, first + k) for k < n, bit for bit, with the
 * hash's (seed, stream) part made once for the run. */
void rng_normals(uint64_t seed, uint64_t stream, uint64_t first, size_t n, float scale,
                 float *out);

#endif
