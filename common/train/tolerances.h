/* How close a strategy must come to the single-device baseline (compare.h), for every
 * chapter and test. Each strategy does the same fp32 arithmetic as the baseline with
 * the sums in another order (ranks' partial gradients, then a reduction; a split
 * matrix product's partial sums, then an all-reduce), so the differences are rounding,
 * a few ulps of the values compared. */
#ifndef TOLERANCES_H
#define TOLERANCES_H

#include "run_config.h"

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

/* ---- mixed precision (bf16, fp16) ----------------------------------------------------
 * A strategy runs the same 16-bit arithmetic as the baseline on the same tokens, so
 * step 1's forward is identical and its gradients differ by the fp32 reduction order
 * alone: TOL_GRADS holds. After an update the fp32 masters differ by rounding (1e-9
 * .. 1e-8), and a master that close to a rounding boundary of the compute copy rounds
 * the other way in one run: its 16-bit weight then differs by a whole 16-bit step
 * (2^-8 relative in bf16). Such flips change the gradients by far more than rounding,
 * and AdamW, which normalises each element's update, turns a changed gradient near 0
 * into a changed step of up to the learning rate: */
/* The loss: measured 7e-5 at most (chapter 2, 2-4 ranks, 5 steps, bf16 and fp16);
 * 10x that, and still 100x below the negative controls. */
#define MIXED_TOL_LOSS 1e-3
/* Longer runs in 16 bits: MIXED_TOL_LOSS was measured over TOL_STEPS steps, and past
 * them each step's rounding keeps moving a run off the exact trajectory (a 16-bit weight
 * flipped by a master's rounding changes its AdamW step by up to the learning rate; in
 * MoE a flipped top-k choice sends a token to another expert). Two runs that round
 * independently are, step by step, at most their two distances from the exact run apart
 * (the triangle inequality); a strategy that trains as one device would is as far from
 * exact as one device is. So its loss is held within MIXED_SPREAD_FACTOR times the
 * 16-bit baseline's own largest distance from the fp32 one (fp32 standing for exact: its
 * rounding is 1e-6 of the loss), and never less than MIXED_TOL_LOSS. Measured on chapter
 * 11's 4-rank meshes in bf16 over 10-20 steps: dense 1.5e-4 .. 7e-4 from one device,
 * bf16's distance from fp32 2.7e-3 .. 3.5e-3; MoE (EP 2 x PP 2, 4 micro-batches)
 * 1.9e-3 .. 2.4e-3 from one device, bf16 from fp32 2.9e-3. */
#define MIXED_SPREAD_FACTOR 2
/* The loss bound of a 16-bit run of `steps` steps (> TOL_STEPS) from the 16-bit and the
 * fp32 baselines' losses per step: fmax(MIXED_TOL_LOSS, MIXED_SPREAD_FACTOR x the largest
 * |loss16 - loss32|); MIXED_TOL_LOSS where either is NaN (no spread to allow). */
double mixed_loss_tolerance(const float *loss16, const float *loss32, int steps);

/* ---- ZeRO++ (zeropp.h): quantised collectives, lossy by design ----------------------
 * Block quantisation with Q levels (int8: Q = 127, int4: Q = 7) rounds each element to
 * the nearest multiple of its block's scale s = A / Q (A: the largest |x| of its block
 * of b elements), so |x' - x| <= s / 2 = A / (2 Q) (quant_block_bound; b enters through
 * A: the larger the block, the larger the value that sets its scale). Hence:
 *   qwZ  every weight of step 1 within A_w / 254 of the master, A_w its block's largest
 *        (b = ZEROPP_WEIGHT_BLOCK of one rank's shard): step 1's gradient is the
 *        baseline's gradient at those weights, which the tests build by quantising each
 *        shard serially; against it TOL_GRADS holds (fp32 reduction order alone);
 *   qgZ  an element's gradient goes through N + d encodings (its N ranks' pieces inside
 *        the nodes, then the d nodes' partial sums across), each adding at most its
 *        block's A / 14: |g' - g| <= sum over ranks r of A_r / 14 + sum over nodes j of
 *        A_j / 14 (b = ZEROPP_GRAD_BLOCK), plus TOL_GRADS; the tests compute the A's
 *        from every rank's own step-1 gradient and hold each element to its sum.
 * The loss then follows another path, held against fp32's (ZeRO-3's, or the baseline's)
 * by a band, empirical like MIXED_TOL_LOSS: in runs of up to ZEROPP_BAND_STEPS steps,
 * every step within ZEROPP_LOSS_BAND of fp32's loss (measured ZEROPP_LOSS_MEASURED at
 * most: qwZ, qgZ and all three, 4 ranks as 2 nodes of 2 over 20 steps in test_zeropp, 8
 * as 2 of 4 over 3 in chapter 12; the wrong-scale control leaves it 10x over); in longer
 * runs single steps drift apart (a 2-layer dim-64 model over 300 steps in chapter 2: one
 * step 4.3% off, while the curves track), so the mean loss over the run within
 * ZEROPP_MEAN_BAND of fp32's mean (measured there 0.61%, ZeRO++ the lower). Each band is
 * about 3x what was measured. */
#define ZEROPP_LOSS_MEASURED 3e-3
#define ZEROPP_LOSS_BAND 1e-2
#define ZEROPP_BAND_STEPS 20
#define ZEROPP_MEAN_BAND 2e-2
/* Of the band (1 = at it): up to ZEROPP_BAND_STEPS steps, the largest |loss - fp32's| /
 * (ZEROPP_LOSS_BAND x fp32's); longer, |mean - fp32's mean| / (ZEROPP_MEAN_BAND x fp32's
 * mean). A NaN loss gives NaN, which no band holds. */
double zeropp_loss_band_fraction(const float *loss, const float *fp32_loss, int steps);

typedef struct {
    double grads, loss, params;
} run_tolerances;

/* How far two runs' parameters can drift apart when their gradients differ: AdamW
 * moves an element by at most about the step's learning rate (Kingma and Ba's bound
 * |update| <= lr when 1 - beta1 <= sqrt(1 - beta2), true of the defaults), so by at
 * most 2 x the sum of the scheduled learning rates over `steps` (warm-up included). */
double adamw_drift_bound(const adamw_config *adamw, int steps);
/* The tolerances a run is held to: TOL_GRADS, TOL_LOSS, TOL_PARAMS in fp32; in mixed
 * precision TOL_GRADS, MIXED_TOL_LOSS and adamw_drift_bound(cfg's AdamW, its steps).
 * DDP, ZeRO and pipelines: their 16-bit arithmetic per token is the baseline's. */
run_tolerances tolerances_for(const run_config *cfg);
/* Both functions below (and so every chapter's verdict) also allow for fp16's products
 * where they are widened to fp32 (matmul16's fallback: oneDNN has no fp16 matmul on
 * most CPUs). oneDNN's fp32 kernel sums a row the same way in any call of 16 rows or
 * more, but a call of fewer (a micro-batch of one short sequence) runs another kernel,
 * whose rows may differ from the whole batch's in their last fp32 bit; the output's
 * rounding to fp16 then lands one unit (u = 2^-11) apart. Each of a block's 4 linears
 * and the LM head may flip so, to first order linearly in the gradients: step 1's
 * gradients within (4 L + 1) u G (G = largest_grad). oneDNN's AVX512-BF16 kernel sums a
 * row the same way in any call of 2 rows or more (measured: bf16 pipelines, DDP and ZeRO
 * within 1e-7 of the baseline), and fp32 rounds nothing to 16 bits: neither needs it.
 * Its AMX kernel sums a call of one row differently (measured: 1 row of 64 in a split
 * of 1 + 15 + 48; DualPipeV bf16 1.5e-5 from the baseline): a native kernel that
 * matmul16_rows_invariant finds so gets the same allowance, in its u.
 *
 * The same with tensor parallelism over tp ranks, which rounds differently from the
 * unsplit model by construction: a row-parallel linear rounds each rank's partial
 * product to 16 bits and the 16-bit all-reduce rounds their sum again, where one device
 * rounds the fp32 sum once, and f's backward does the same to d(input). Each of those
 * 4 all-reduces per block adds about one unit u of relative rounding (2^-8 in bf16,
 * 2^-11 in fp16) to an activation the rest of the model reads linearly to first
 * order, so in 16 bits step 1's gradients may differ by 4 L u G (G the largest of
 * largest_grad, the baseline's step-1 gradient) and the loss, a mean over B T tokens
 * of independently perturbed terms of about ln V, by 4 L u ln V / sqrt(B T). In fp32
 * (and tp 1): tolerances_for. */
run_tolerances tolerances_for_tp(const run_config *cfg, int tp, double largest_grad);
/* With 16-bit gradients (--grad-dtype bf16|fp16) step 1's gradients differ by
 * rounding at 16 bits: the baseline rounds each gradient once (|error| <= u G, u =
 * 2^-8 in bf16, 2^-11 in fp16, G = largest_grad, its largest step-1 gradient); a
 * strategy rounds each of its `parts` partial gradients (ranks x micro-batches, each
 * of them at most G in size) once, and the 16-bit reduction rounds their sum once
 * more: (parts + 2) u G in all. Loss and parameters keep tolerances_for's (AdamW's
 * drift bound already allows any gradient difference). fp32 gradients:
 * tolerances_for. */
run_tolerances tolerances_for_grads16(const run_config *cfg, int parts, double largest_grad);
/* Tolerances t of another strategy (tolerances_for_tp: a mesh, a pipeline) for a run
 * with 16-bit gradients: its gradient bound at least (parts + 2) u G, as above, with
 * parts the dp ranks whose partial gradients are rounded (a pipeline sums its
 * micro-batches in fp32 first); t's other bounds unchanged. */
run_tolerances tolerances_with_grads16(run_tolerances t, const run_config *cfg, int parts,
                                       double largest_grad);
/* MoE's experts where the 16-bit products run matmul16's fallback (matmul16_widens: on a
 * CPU without native 16-bit products, bf16's too): widened to fp32 and run 16 rows a
 * call, whose kernel sums a row by where it falls in the call. A dense rank's rows sit
 * where one device's do (a multiple of 16 at a multiple of 16); an expert's rows are the
 * pairs routed to it, from several sources on an expert rank, so the same pair's row
 * sits elsewhere than on one device, its product may differ in a last fp32 bit and round
 * one unit u apart (seen: one row in about 2000, chapter 11 tp 1 x ep 2 x dp 4 bf16).
 * Each MoE block's two expert products forward and two backward may flip so, as TP's
 * four all-reduces a block do (tolerances_for_tp): step 1's gradients within 4 M u G and
 * the loss within 4 M u ln V / sqrt(B T), M the MoE blocks; t's bounds where larger.
 * Native 16-bit products that sum a row alike anywhere (matmul16_rows_invariant):
 * t unchanged; AMX's bf16, which does not, gets the same allowance. */
run_tolerances tolerances_with_moe_rows(run_tolerances t, const run_config *cfg, int moe_blocks,
                                        double largest_grad);
/* MoE in fp32 past TOL_STEPS steps: AdamW moves two runs' parameters apart where a
 * gradient is near 0 (up to the learning rate, see above), a router's near-tied choice
 * then flips, the token takes another expert (with a capacity, another token is
 * dropped), and the runs part by O(1 / tokens) of the loss a flip, growing from there
 * (seen: chapter 11 bench256 tp 1 x ep 2 x dp 4, 4.9e-5 at step 4, 1.5e-2 at step 9,
 * step 1's gradients within 1.2e-7). So past TOL_STEPS, as the fp32 tolerances say of
 * every run, the loss is not held (t.loss 0) and the parameters are held within AdamW's
 * drift bound (which holds whatever the gradients); step 1's gradients keep t's bound.
 * Dense runs, runs of TOL_STEPS steps or fewer and 16-bit ones (held from their fp32
 * twin past TOL_STEPS: mixed_loss_tolerance): t unchanged. */
run_tolerances tolerances_with_moe_routing(run_tolerances t, const run_config *cfg,
                                           int moe_blocks);

#endif
