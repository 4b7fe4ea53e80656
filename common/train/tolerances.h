/* How close a strategy must come to the single-device baseline (compare.h), for every
 * chapter and test. Each strategy does the same fp32 arithmetic as the baseline with
 * the sums in another order (ranks' partial gradients, then a reduction; a split
 * matrix product's partial sums, then an all-reduce), so the differences are rounding,
 * a few ulps of the values compared. */
#ifndef TOLERANCES_H
#define TOLERANCES_H

/* The gradients of step 1, before any update: rounding alone, on gradients of order
 * 1e-2 .. 1e-1, so a few ulps of those. */
#define TOL_GRADS 1e-6
/* The global-batch mean loss per step (of order ln(vocab), about 5): a few ulps of it,
 * plus what the few steps' parameter differences add. */
#define TOL_LOSS 1e-5
/* The parameters after the last step. AdamW divides by sqrt(v): where a gradient is
 * near zero, a rounding difference changes that element's update by a good part of the
 * learning rate (1e-3 by default), so parameters may differ by a tenth of it. */
#define TOL_PARAMS 1e-4
/* Loss and parameters are held to the tolerances above only in runs of at most this
 * many steps: over many steps the AdamW differences above grow towards the learning
 * rate, while the gradients of step 1 are always checked. */
#define TOL_STEPS 5
/* One split layer or block against the unsplit one (chapter 3's parts 1 and 2): one
 * product of values of order 1, summed in another order. */
#define TOL_LAYER 1e-5

#endif
