/* The splits of a sequence over a CP group (cp_split.h). */
#include "cp_split.h"

#include <string.h>

const char *cp_split_name(cp_split split) {
    return split == CP_BALANCED ? "balanced" : "contiguous";
}

position_span cp_span_of(int T, int P, int rank, cp_split split) {
    if (split == CP_CONTIGUOUS || P == 1)
        return (position_span){.pieces = 1, .start = {rank * (T / P)}, .len = {T / P}};
    const int piece = T / (2 * P);   /* pieces rank and 2P-1-rank, in position order */
    return (position_span){.pieces = 2, .start = {rank * piece, (2 * P - 1 - rank) * piece},
                           .len = {piece, piece}};
}

void cp_span_rows(const position_span *span, int B, int T, const int *whole, int *rows) {
    for (int b = 0; b < B; b++)
        for (int k = 0; k < span->pieces; k++) {
            const size_t n = (size_t)span->len[k];
            memcpy(rows, whole + (size_t)b * T + span->start[k], n * sizeof(int));
            rows += n;
        }
}
