/* Each rank's passes in the order its schedule runs them (pp_schedule.c's dry run then
 * times them and places the messages between). Inside the library only. */
#ifndef PP_PLAN_H
#define PP_PLAN_H
#include "pp_schedule.h"

typedef struct {
    pp_op_kind kind;   /* F, B, or B (input) and W; a W in a plan runs the oldest W owed */
    int micro, chunk;
    int fused;         /* 1: runs together with the next pass, a backward (DualPipe's F&B) */
} pass;

typedef struct {
    pass *passes;      /* room for pp_plan_room(m, v) */
    int count;
} rank_plan;

static inline int pp_plan_room(int m, int v) { return 3 * m * v; }

/* Rank r's plan of kind for p ranks, m micro-batches, v chunks per rank. */
void pp_plan_rank(rank_plan *plan, pp_schedule_kind kind, int p, int r, int m, int v);
/* DualPipe's rank r (pp_dualpipe_make): p even, m even. */
void pp_plan_dualpipe_rank(rank_plan *plan, int p, int r, int m);

#endif
