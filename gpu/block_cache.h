/* The bookkeeping of the device allocator's cache (gpu/device_cuda.c).
 *
 * cudaMalloc is slow and cudaFree waits for the whole device, so freed device blocks are
 * kept and handed out again: ZeRO's per-step slab gradients, the threads backend's
 * per-request scratch and the like then cost no CUDA allocation after the first step.
 * Blocks are reused best fit on the same GPU, never more than twice the size asked for
 * (a small request must not pin a large block). Live blocks are found by pointer, so
 * that a free needs no size.
 *
 * Host code only (no CUDA): tests/test_gpu_host.c checks it on any machine. Not
 * thread-safe: the caller holds its lock. */
#ifndef BLOCK_CACHE_H
#define BLOCK_CACHE_H
#include <stddef.h>
#include <stdint.h>

#define BLOCK_CACHE_GRAIN ((size_t)512)   /* sizes are rounded up to this */
#define BLOCK_CACHE_BUCKETS 256

typedef struct cached_block {
    void *ptr;                  /* device memory */
    size_t capacity;            /* bytes, a multiple of BLOCK_CACHE_GRAIN */
    int gpu;
    void *freed_event;          /* where the freeing stream was at the free (CUDA event) */
    struct cached_block *next;  /* in a bucket of live blocks, or in the free list */
} cached_block;

typedef struct {
    cached_block *live[BLOCK_CACHE_BUCKETS];   /* handed out, by pointer */
    cached_block *idle;                        /* freed, waiting for reuse */
    size_t idle_bytes;
} block_cache;

static inline size_t block_cache_round(size_t bytes) {
    if (bytes == 0) bytes = 1;   /* a unique pointer even for 0 bytes, as malloc gives */
    return (bytes + BLOCK_CACHE_GRAIN - 1) / BLOCK_CACHE_GRAIN * BLOCK_CACHE_GRAIN;
}

static inline cached_block **block_cache_bucket(block_cache *c, const void *ptr) {
    return &c->live[((uintptr_t)ptr / BLOCK_CACHE_GRAIN) % BLOCK_CACHE_BUCKETS];
}

/* The idle block on gpu that best fits `bytes` (capacity >= rounded bytes and <= twice
 * that), taken out of the idle list; NULL when none fits. */
static inline cached_block *block_cache_take(block_cache *c, int gpu, size_t bytes) {
    const size_t want = block_cache_round(bytes);
    cached_block **best = NULL;
    for (cached_block **link = &c->idle; *link; link = &(*link)->next) {
        const cached_block *b = *link;
        if (b->gpu != gpu || b->capacity < want || b->capacity / 2 > want) continue;
        if (!best || b->capacity < (*best)->capacity) best = link;
    }
    if (!best) return NULL;
    cached_block *b = *best;
    *best = b->next;
    b->next = NULL;
    c->idle_bytes -= b->capacity;
    return b;
}

/* A block handed out (new or reused): findable by its pointer until released. */
static inline void block_cache_track(block_cache *c, cached_block *b) {
    cached_block **bucket = block_cache_bucket(c, b->ptr);
    b->next = *bucket;
    *bucket = b;
}

/* The live block at ptr, no longer live; NULL when ptr was not handed out here. */
static inline cached_block *block_cache_release(block_cache *c, const void *ptr) {
    for (cached_block **link = block_cache_bucket(c, ptr); *link; link = &(*link)->next) {
        if ((*link)->ptr != ptr) continue;
        cached_block *b = *link;
        *link = b->next;
        b->next = NULL;
        return b;
    }
    return NULL;
}

/* A released block kept for reuse. */
static inline void block_cache_keep(block_cache *c, cached_block *b) {
    b->next = c->idle;
    c->idle = b;
    c->idle_bytes += b->capacity;
}

/* Every idle block of gpu, taken out (to give back to CUDA when memory runs short). */
static inline cached_block *block_cache_drain(block_cache *c, int gpu) {
    cached_block *drained = NULL;
    for (cached_block **link = &c->idle; *link;) {
        cached_block *b = *link;
        if (b->gpu != gpu) {
            link = &b->next;
            continue;
        }
        *link = b->next;
        c->idle_bytes -= b->capacity;
        b->next = drained;
        drained = b;
    }
    return drained;
}

#endif
