/* A double-precision reference of one MoE layer (moe.h) for test_moe's finite
 * differences: router, softmax, top-k, capacity, experts and gates, as the course
 * writes them, with nothing shared with the float code but the weights' layout. */
#ifndef MOE_REFERENCE_H
#define MOE_REFERENCE_H

#include "moe.h"

/* J = sum(G * out) + aux, for inputs x [N, C] and the float layer's weights (routers and
 * every expert of MoE block 0), all widened to double. */
double moe_reference_objective(const moe_shape *s, int N, const double *x,
                               const double *router, const double *experts,
                               const double *G);

#endif
