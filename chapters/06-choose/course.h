/* The course text's rule-of-thumb table as data, so that tests can check the
 * planner's verdict on each bracket. */
#ifndef COURSE_H
#define COURSE_H

#include "planner.h"

typedef struct {
    const char *bracket;         /* "< 1B", "1-13B", ... */
    double params;               /* a model inside it */
    const char *advice;          /* what the course recommends */
    plan_mesh mesh;              /* that advice on course_cluster() */
    int recompute;               /* -1: the lightest that fits */
} course_bracket;

extern const course_bracket COURSE_BRACKETS[];
extern const int COURSE_NUM_BRACKETS;

/* 256 H100s of 80 GB, 8 per node, InfiniBand, 40% of 989 TFLOP/s; s 2048, B 2048, b 1. */
plan_request course_cluster(double params);
/* The course's advice evaluated on that cluster. */
plan_row course_advice_row(const course_bracket *b);
/* The decision tree's verdict and the fastest fitting mesh. */
void course_verdict(const course_bracket *b, plan_decision *d, plan_row *fastest);

/* "agrees", "agrees in kind" (same family, another ZeRO stage or recomputation) or
 * "differs". */
const char *course_agreement(const plan_row *advice, const plan_row *tree);

#endif
