/* Whether two byte ranges of one address space overlap, for the copies that promise
 * memmove semantics (cuda_vec_copy, the communicator's device copies): CUDA's copies
 * on overlapping ranges are undefined. With unified addressing host and device
 * pointers never alias, so comparing addresses is enough. C and CUDA C++, host code. */
#ifndef OVERLAP_H
#define OVERLAP_H
#include <stddef.h>
#include <stdint.h>

static inline int ranges_overlap(const void *dst, const void *src, size_t bytes) {
    const uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    return bytes > 0 && d != s && (d < s ? s - d < bytes : d - s < bytes);
}

#endif
