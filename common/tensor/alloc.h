/* Accounting allocator: every buffer carries a tag, and current and peak bytes are
 * kept per tag for the rank that allocated it, so memory tables are measured. */
#ifndef ALLOC_H
#define ALLOC_H
#include <stddef.h>

typedef enum {
    MEM_PARAMS,
    MEM_GRADS,
    MEM_OPTIMIZER,
    MEM_ACTIVATIONS,
    MEM_COMM,
    MEM_OTHER,
    MEM_NTAGS
} mem_tag;

/* Where a buffer lives. Device buffers are counted like host buffers. */
typedef enum { MEM_HOST, MEM_DEVICE } mem_place;

typedef struct {
    size_t current[MEM_NTAGS];
    size_t peak[MEM_NTAGS];
    size_t current_total;
    size_t peak_total;   /* peak of the sum over tags, not the sum of peaks */
} mem_stats;

/* The stats that allocations on this thread are charged to. The launcher gives each
 * rank its own; a thread that set none is charged to a per-thread default. */
void mem_stats_bind(mem_stats *stats);
mem_stats *mem_stats_current(void);
void mem_stats_reset_peaks(mem_stats *stats);

/* 64-byte aligned, zero-filled host memory; exits with a message when out of memory. */
void *mem_alloc(mem_tag tag, size_t bytes);
/* Same, on the current device (host memory when the rank runs on the CPU). */
void *mem_alloc_on(mem_place place, mem_tag tag, size_t bytes);
void mem_free(void *ptr);   /* NULL is fine; charged back to the stats that paid */

/* Frees every host buffer still charged to stats: what a rank that was stopped in the
 * middle of its work (a failure elsewhere) could not free itself. Quadratic in the
 * buffers left, which is fine for a path taken once, at the end. */
void mem_free_all_charged_to(mem_stats *stats);

const char *mem_tag_name(mem_tag tag);

#endif
