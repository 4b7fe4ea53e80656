#include "alloc.h"
#include "device.h"
#include "matmul_f32.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* Each allocation is preceded by a header so that mem_free knows what to give back
 * and to whom, even when another thread frees it. Host buffers are also on one list of
 * the live ones, so that what a stopped rank still held can be given back. */
typedef struct alloc_header {
    mem_stats *owner;
    size_t bytes;
    void *device_ptr;   /* non-NULL for device buffers: the header stays on the host */
    struct alloc_header *prev, *next;   /* live host buffers */
    int tag;
    int place;
    char pad[64 - 2 * sizeof(size_t) - 3 * sizeof(void *) - 2 * sizeof(int)];
} alloc_header;

static alloc_header *live_host_buffers;
static pthread_mutex_t live_host_lock = PTHREAD_MUTEX_INITIALIZER;

static void live_add(alloc_header *h) {
    pthread_mutex_lock(&live_host_lock);
    h->prev = NULL;
    h->next = live_host_buffers;
    if (h->next) h->next->prev = h;
    live_host_buffers = h;
    pthread_mutex_unlock(&live_host_lock);
}

static void live_remove(alloc_header *h) {
    pthread_mutex_lock(&live_host_lock);
    if (h->prev) h->prev->next = h->next;
    else live_host_buffers = h->next;
    if (h->next) h->next->prev = h->prev;
    pthread_mutex_unlock(&live_host_lock);
}

_Static_assert(sizeof(alloc_header) == 64, "header keeps 64-byte alignment");

static _Thread_local mem_stats *bound_stats;
static _Thread_local mem_stats thread_default_stats;

void mem_stats_bind(mem_stats *stats) { bound_stats = stats; }

mem_stats *mem_stats_current(void) {
    return bound_stats ? bound_stats : &thread_default_stats;
}

void mem_stats_reset_peaks(mem_stats *stats) {
    for (int t = 0; t < MEM_NTAGS; t++) stats->peak[t] = stats->current[t];
    stats->peak_total = stats->current_total;
}

const char *mem_tag_name(mem_tag tag) {
    static const char *names[MEM_NTAGS] = {"params", "grads", "optimizer",
                                           "activations", "comm", "other"};
    return (tag >= 0 && tag < MEM_NTAGS) ? names[tag] : "?";
}

static void charge(mem_stats *stats, int tag, size_t bytes) {
    stats->current[tag] += bytes;
    stats->current_total += bytes;
    if (stats->current[tag] > stats->peak[tag]) stats->peak[tag] = stats->current[tag];
    if (stats->current_total > stats->peak_total) stats->peak_total = stats->current_total;
}

/* Device buffers are tracked in a side table keyed by the device pointer (their
 * memory can't hold a host header). One table for the process, so that any thread
 * may free a buffer; device allocations are rare (setup time), so a lock is fine. */
typedef struct device_entry {
    void *device_ptr;
    alloc_header header;
    struct device_entry *next;
} device_entry;
static device_entry *device_entries;
static pthread_mutex_t device_entries_lock = PTHREAD_MUTEX_INITIALIZER;

/* Host buffers of a huge page or more start on a huge-page boundary and ask for
 * transparent huge pages. A step walks about 100 MB of weights, gradients, optimizer
 * state and activations (bench256), far more than 4 KB pages let the TLB cover: with
 * huge pages its step / sgemm floor measured 1.16 for 1.18, AdamW 48 GB/s for 44. Where
 * the kernel has THP off, madvise fails and nothing changes; where it is "always", it
 * is a no-op. */
#define HUGE_PAGE ((size_t)2 << 20)

static alloc_header *host_alloc(size_t total) {
    if (total < HUGE_PAGE) return aligned_alloc(64, total);
    const size_t whole = (total + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    alloc_header *h = aligned_alloc(HUGE_PAGE, whole);
    if (h) (void)madvise(h, whole, MADV_HUGEPAGE);
    return h;
}

void *mem_alloc(mem_tag tag, size_t bytes) {
    return mem_alloc_on(MEM_HOST, tag, bytes);
}

void *mem_alloc_on(mem_place place, mem_tag tag, size_t bytes) {
    mem_stats *stats = mem_stats_current();
    if (place == MEM_DEVICE && device_current() != DEVICE_CPU) {
        device_entry *entry = calloc(1, sizeof *entry);
        if (!entry) { fprintf(stderr, "error: out of host memory\n"); exit(1); }
        entry->device_ptr = device_malloc(bytes);
        entry->header = (alloc_header){.owner = stats, .bytes = bytes, .tag = tag,
                                       .place = MEM_DEVICE,
                                       .device_ptr = entry->device_ptr};
        pthread_mutex_lock(&device_entries_lock);
        entry->next = device_entries;
        device_entries = entry;
        pthread_mutex_unlock(&device_entries_lock);
        charge(stats, tag, bytes);
        return entry->device_ptr;
    }
    size_t total = sizeof(alloc_header) + ((bytes + 63) & ~(size_t)63);
    alloc_header *header = host_alloc(total);
    if (!header) {
        fprintf(stderr, "error: out of memory allocating %zu bytes for %s\n", bytes,
                mem_tag_name(tag));
        exit(1);
    }
    memset(header, 0, total);
    header->owner = stats;
    header->bytes = bytes;
    header->tag = tag;
    header->place = MEM_HOST;
    charge(stats, tag, bytes);
    live_add(header);
    /* new weights may sit where freed ones did: the fp32 engine's layouts are stale */
    if (tag == MEM_PARAMS) matmul_weights_changed();
    return header + 1;
}

void mem_free(void *ptr) {
    if (!ptr) return;
    {
        device_entry *found = NULL;
        pthread_mutex_lock(&device_entries_lock);
        for (device_entry **link = &device_entries; *link; link = &(*link)->next) {
            if ((*link)->device_ptr == ptr) {
                found = *link;
                *link = found->next;
                break;
            }
        }
        pthread_mutex_unlock(&device_entries_lock);
        if (found) {
            found->header.owner->current[found->header.tag] -= found->header.bytes;
            found->header.owner->current_total -= found->header.bytes;
            device_free(ptr);
            free(found);
            return;
        }
    }
    alloc_header *header = (alloc_header *)ptr - 1;
    if (header->tag == MEM_PARAMS) matmul_weights_changed();
    live_remove(header);
    header->owner->current[header->tag] -= header->bytes;
    header->owner->current_total -= header->bytes;
    free(header);
}

void mem_free_all_charged_to(mem_stats *stats) {
    for (;;) {
        void *ptr = NULL;
        pthread_mutex_lock(&live_host_lock);
        for (alloc_header *h = live_host_buffers; h && !ptr; h = h->next)
            if (h->owner == stats) ptr = h + 1;
        pthread_mutex_unlock(&live_host_lock);
        if (!ptr) return;
        mem_free(ptr);
    }
}
