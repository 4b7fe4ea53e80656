/* Chapter 3: tensor parallelism. One layer's matrix split across ranks, checked number
 * by number against the unsplit one:
 *   part 1  y = W x split by rows (all-gather) and by columns (all-reduce), by hand
 *   part 2  one transformer block, Megatron style: heads and MLP units split, f and g
 *   part 3  the whole model trained with TP (vocab-parallel embedding and loss),
 *           against the single-device baseline
 *
 *   make chapter3 && ./run 4 [--tp 2] [--part train] [--link ethernet] [--trace t.json] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "compare.h"
#include "fits.h"
#include "report.h"
#include "tensor_parallel.h"
#include "tolerances.h"

static const char *const part_names[] = {"all", "split", "block", "train", NULL};
enum { PART_ALL, PART_SPLIT, PART_BLOCK, PART_TRAIN };
static const char *const link_names[] = {"none", "nvlink", "ib", "ethernet"};


typedef struct {
    run_config cfg;
    int tp, part, sp;   /* sp: part 3 with sequence parallelism (chapter 9) */
    const dataset *data;
    const baseline_run *baseline;   /* in the process of world rank 0 */
    strategy_outcome run;           /* part 3's, buffers allocated before the ranks start */
    tp_extra run_extra;
} chapter_args;

static int runs_part(const chapter_args *a, int part) {
    return a->part == PART_ALL || a->part == part;
}

/* ---- part 3's printout ----------------------------------------------------------------- */

static void print_part3_intro(const chapter_args *a, int world) {
    const gpt_config *m = &a->cfg.model;
    const int t = a->tp, d = world / t;
    const gpt_shape s = gpt_shape_make(m, t, 0), whole = gpt_shape_make(m, 1, 0);
    gpt_shape v = s;
    tp_split_vocab(&v, t);
    printf("Part 3. Training the whole model with TP = %d", t);
    if (d > 1) printf(" x DP = %d (ranks r, r+1, ... of one TP group are neighbours)", d);
    printf("\n  each rank holds %d of %d heads and %d of %d MLP units in every block,\n",
           s.heads_local, m->heads, s.hidden_local, 4 * m->dim);
    if (!v.vocab_parallel) {   /* 16 bits: the vocab-parallel loss is fp32's alone */
        printf("  and the whole %d-token vocabulary (embedding = tied LM head), replicated:"
               " in %s the vocab-parallel loss is not used (it computes in fp32 only)\n",
               m->vocab, precision_name(a->cfg.precision));
    } else {
        printf("  and %d rows of the %d-token vocabulary (embedding = tied LM head), rows",
               v.vocab_local, m->vocab);
        for (int r = 0; r < t; r++) {
            int lo = r * v.vocab_local, hi = lo + v.vocab_local - 1;
            if (hi >= m->vocab) hi = m->vocab - 1;
            printf("%s %d-%d", r ? "," : "", lo, hi);
        }
        int padding = v.vocab_local * t - m->vocab;
        if (padding) printf(" (+%d zero padding row%s)", padding, padding > 1 ? "s" : "");
        printf(";\n  the loss is built from 3 numbers per token (max, sum of exp, target"
               " logit): the full logits are never gathered\n");
    }
    size_t mine = gpt_num_params(&v), all = gpt_num_params(&whole);
    char a_[32], b_[32];
    printf("  parameters per rank: %zu (%s) of %zu (%s): %.2fx\n", mine,
           report_bytes(4.0 * mine, a_), all, report_bytes(4.0 * all, b_),
           (double)mine / all);
    if (a->baseline)
        printf("  baseline: trained on one rank before the ranks started (%d steps, final"
               " loss %.4f, %.1f ms/step)\n\n", a->cfg.steps,
               a->baseline->loss[a->cfg.steps - 1], run_ms_per_step(&a->baseline->result));
    fflush(stdout);
}

static void print_memory_row(const char *name, const mem_stats *m) {
    char p[32], g[32], o[32], act[32], c[32], peak[32];
    printf("  %-10s %10s %10s %10s %12s %10s %10s\n", name,
           report_bytes((double)m->peak[MEM_PARAMS], p), report_bytes((double)m->peak[MEM_GRADS], g),
           report_bytes((double)m->peak[MEM_OPTIMIZER], o),
           report_bytes((double)m->peak[MEM_ACTIVATIONS], act),
           report_bytes((double)m->peak[MEM_COMM], c), report_bytes((double)m->peak_total, peak));
}

/* The TP term of the bytes formula part 3 prints. */
static const char *tp_formula_text(const run_config *cfg, const tp_extra *x) {
    if (!x->vocab_parallel) return "e x 4L B T C";
    return cfg->precision == PRECISION_FP32 ? "4 B x ((4L+2) B T C + 3 B T)"
                                            : "(2 B x (4L+2) B T C + 4 B x 3 B T) (16-bit"
                                              " activations, the loss's numbers fp32)";
}

static int print_part3_summary(const chapter_args *a, comm *world, const strategy_outcome *run) {
    const run_config *cfg = &a->cfg;
    const run_result *r = &run->result, *b = &a->baseline->result;
    const int L = cfg->model.layers;
    char x[32], y[32];
    printf("\nmemory per rank (measured peaks)\n  %-10s %10s %10s %10s %12s %10s %10s\n",
           "", "params", "grads", "optimizer", "activations", "comm", "peak");
    print_memory_row("baseline", &b->memory);
    print_memory_row(r->strategy, &r->memory);
    const int sp = tp_extra_of(run)->sequence_parallel;
    printf("  (parameters, gradients and AdamW state shrink to about 1/t; activations only"
           " in part: heads and MLP units are split, but every TP rank keeps %s)\n",
           sp ? "the scratch of SP's gathers" : "the whole residual stream and LayerNorm outputs");
    if (tp_extra_of(run)->sequence_parallel)
        printf("\nsequence parallelism: f and g became all-gathers and reduce-scatters along"
               " the sequence (g, g-bar); chapter 9 counts them collective by collective\n");
    else if (tp_extra_of(run)->vocab_parallel)
        printf("\nall-reduces per step on the TP group: %.0f measured; 4L + 4 = %d expected"
               " (2 + 2 per block, 1 embedding, 2 loss, 1 LM head backward)\n",
               tp_extra_of(run)->allreduces_per_step, 4 * L + 4);
    else   /* one TP rank: the vocabulary whole, the blocks' f and g alone */
        printf("\nall-reduces per step on the TP group: %.0f measured; 4L = %d expected"
               " (2 + 2 per block; the vocabulary is not split)\n",
               tp_extra_of(run)->allreduces_per_step, 4 * L);
    printf("bytes sent per rank per step: %s measured, %s by the ring formula"
           " 2(t-1)/t x %s%s%s\n", report_bytes(r->bytes_sent_per_step, x),
           r->bytes_formula >= 0 ? report_bytes(r->bytes_formula, y) : "-",
           tp_formula_text(cfg, tp_extra_of(run)),
           tp_extra_of(run)->dp > 1 ? (cfg->grad_precision == PRECISION_FP32
                                           ? " + DP's 2(d-1)/d x fp32 gradient bytes"
                                           : " + DP's 2(d-1)/d x 16-bit gradient bytes")
                                    : "",
           sp ? " + SP's inputs gathered again and LayerNorm gradients (chapter 9)" : "");
    const double ms_per_step = run_ms_per_step(r);
    const double comm_ms = r->timed_steps ? 1e3 * r->comm_seconds / r->timed_steps : 0.0;
    printf("communication: %.1f%% of the step (%s backend, --link %s): %.2f of %.2f ms"
           " blocked in collectives\n", 100.0 * run_comm_fraction(r),
           comm_backend_name(world), link_names[cfg->comm.link], comm_ms, ms_per_step);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores > 0 && comm_size(world) > cores)
        printf("  (%d ranks share %ld cores here: much of that is waiting for a rank that"
               " had no core, not the wire)\n", comm_size(world), cores);
    if (strcmp(comm_backend_name(world), "threads") != 0)
        printf("  (--link models a wire on the threads backend only; below, the arithmetic)\n");
    else if (cfg->comm.link == LINK_NONE)
        printf("  try --link ethernet (or --link-scale 100 to make this CPU's compute look"
               " like a GPU's next to the wire)\n");
    print_link_projection(cfg, tp_extra_of(run)->tp, cfg->batch / tp_extra_of(run)->dp, ms_per_step - comm_ms);
    printf("replicated tensors (LayerNorms, wpe, row-parallel biases) on every TP rank:"
           " largest difference %.1e\n", tp_extra_of(run)->replica_drift);
    /* The gradients of step 1 are the exact check: the same numbers summed in another
     * order. Loss and parameters after several steps also carry the training's own
     * amplification of those rounding differences, which a loss spike makes large. */
    /* In 16 bits TP's all-reduces round partial sums too: bounds of their own */
    /* and 16-bit gradients round each dp rank's sum and the reduction's (tolerances.h) */
    const run_tolerances bounds = tolerances_with_grads16(
        tp_run_tolerances(cfg, tp_extra_of(run)->tp, a->baseline), cfg, tp_extra_of(run)->dp,
        baseline_largest_grad(a->baseline));
    const int grads_ok = r->diff_grads <= bounds.grads;
    const int later_ok = r->diff_loss <= bounds.loss && r->diff_params <= bounds.params;
    printf("\ntolerances vs baseline (%s, sums in another order): grads of step 1 %.0e ->"
           " %s; loss %.0e and params %.0e after %d steps -> %s\n",
           precision_name(cfg->precision), bounds.grads, grads_ok ? "within" : "EXCEEDED",
           bounds.loss, bounds.params, cfg->steps, later_ok ? "within" : "beyond");
    if (grads_ok && !later_ok) {
        int spike = 0;
        for (int i = 1; i < cfg->steps; i++)
            if (a->baseline->loss[i] - a->baseline->loss[i - 1] > 0.5f) spike = i;
        if (spike)
            printf("  the baseline's own loss jumps from %.2f to %.2f at step %d: a spike"
                   " amplifies rounding differences, in every strategy\n",
                   a->baseline->loss[spike - 1], a->baseline->loss[spike], spike + 1);
        else
            printf("  training amplifies rounding differences over the steps; the tests"
                   " check 5 steps of a small model\n");
    }
    return grads_ok;
}

/* ---- --json ------------------------------------------------------------------------------ */

static void print_json(const chapter_args *a, comm *world, const split_report *split,
                       const block_report *block, const strategy_outcome *run) {
    char extra[2048];
    size_t n = 0;
    n += snprintf(extra + n, sizeof extra - n, "\"tp\": %d, \"dp\": %d", a->tp,
                  comm_size(world) / a->tp);
    if (split)
        n += snprintf(extra + n, sizeof extra - n,
                      ",\n \"split\": {\"rows\": %d, \"cols\": %d, \"diff_column\": %g, "
                      "\"diff_row\": %g, \"bytes_allgather\": %.0f, \"formula_allgather\": %g, "
                      "\"bytes_allreduce\": %.0f, \"formula_allreduce\": %g}",
                      split->rows, split->cols, split->diff_column, split->diff_row,
                      split->bytes_gather, split->formula_gather, split->bytes_reduce,
                      split->formula_reduce);
    if (block)
        n += snprintf(extra + n, sizeof extra - n,
                      ",\n \"block\": {\"allreduces_forward\": %d, \"allreduces_backward\": %d, "
                      "\"bytes_forward\": %.0f, \"bytes_backward\": %.0f, "
                      "\"formula_per_direction\": %.0f, \"params_per_rank\": %zu, "
                      "\"params_whole\": %zu, \"diff_out\": %g, \"diff_dx\": %g, "
                      "\"diff_grads\": %g}",
                      block->allreduces_forward, block->allreduces_backward,
                      block->bytes_forward, block->bytes_backward,
                      2 * block->formula_per_allreduce, block->params_per_rank,
                      block->params_whole, block->diff_out, block->diff_dx, block->diff_grads);
    if (run)
        snprintf(extra + n, sizeof extra - n,
                 ",\n \"train\": {\"vocab_local\": %d, \"vocab_padding\": %d, "
                 "\"params_per_rank\": %zu, \"allreduces_per_step\": %.1f, "
                 "\"bytes_tp_per_step\": %.0f, \"bytes_dp_per_step\": %.0f, "
                 "\"replica_drift\": %g}",
                 tp_extra_of(run)->vocab_local, tp_extra_of(run)->vocab_padding, tp_extra_of(run)->params_per_rank,
                 tp_extra_of(run)->allreduces_per_step, tp_extra_of(run)->bytes_tp_per_step, tp_extra_of(run)->bytes_dp_per_step,
                 tp_extra_of(run)->replica_drift);
    run_result rows[2];
    int count = 0;
    if (run) {
        rows[count++] = a->baseline->result;
        rows[count++] = run->result;
    }
    report_json(&a->cfg, "03-tensor-parallel", comm_size(world), comm_backend_name(world),
                rows, count, extra);
}

/* ---- the ranks ---------------------------------------------------------------------------- */

static int rank_main(comm *world, void *argp) {
    chapter_args *a = argp;
    const int t = a->tp, rank = comm_rank(world), root = rank == 0;
    const run_config *cfg = &a->cfg;
    mesh m;
    mesh_create(&m, world, (mesh_shape){.tp = t, .pp = 1, .dp = comm_size(world) / t});
    comm *tp = m.tp;
    if (root && !cfg->json) {
        char title[128];
        snprintf(title, sizeof title, "Chapter 3: tensor parallelism (Megatron-LM), TP = %d"
                 " over %d ranks", t, comm_size(world));
        report_header(cfg, title, comm_size(world), 1);
    }

    split_report split;
    block_report block;
    strategy_outcome local, *run = strategy_outcome_for_rank(world, &a->run, &local);
    int ok = 1;
    if (root && !cfg->json && cfg->precision != PRECISION_FP32 && a->part == PART_ALL)
        printf("(parts 1 and 2 show the split arithmetic in fp32; part 3 trains in %s)\n\n",
               precision_name(cfg->precision));
    if (runs_part(a, PART_SPLIT)) {
        part1_matrix_split(tp, cfg, &split);
        ok &= split.diff_column <= TOL_LAYER && split.diff_row <= TOL_LAYER;
    }
    comm_barrier(world);
    if (runs_part(a, PART_BLOCK)) {
        part2_block(tp, cfg, &block);
        ok &= block.diff_out <= TOL_LAYER && block.diff_dx <= TOL_LAYER &&
              block.diff_grads <= TOL_LAYER;
    }
    if (root && !cfg->json && a->part != PART_TRAIN)
        printf("split layers against the unsplit ones: all differences within %.0e -> %s\n\n",
               TOL_LAYER, ok ? "yes" : "NO");
    comm_barrier(world);
    if (runs_part(a, PART_TRAIN)) {
        if (root && !cfg->json) print_part3_intro(a, comm_size(world));
        tp_train(world, &m, cfg, &(tp_options){.sequence_parallel = a->sp}, a->data, run);
        if (root)
            compare_to_baseline(&run->result, a->baseline, run->loss, run->first_grads,
                                run->final_params);
        if (root && !cfg->json) {
            run_result rows[2] = {a->baseline->result, run->result};
            report_table(cfg, rows, 2);
            ok &= print_part3_summary(a, world, run);
        }
    }
    if (root && cfg->json)
        print_json(a, world, runs_part(a, PART_SPLIT) ? &split : NULL,
                   runs_part(a, PART_BLOCK) ? &block : NULL,
                   runs_part(a, PART_TRAIN) ? run : NULL);
    fflush(stdout);
    mesh_free(&m);
    return root && !ok ? 1 : 0;
}

int main(int argc, char **argv) {
    chapter_args a = {.cfg = run_config_default()};
    const cli_option options[] = {
        {"tp", OPT_INT, &a.tp, "tensor-parallel size (default: the rank count; the rest"
         " of the ranks is data parallel)", NULL, 1},
        {"part", OPT_CHOICE, &a.part, "which part to run", part_names, 0},
        {"sp", OPT_FLAG, &a.sp, "part 3 with Megatron sequence parallelism on the TP group"
         " (chapter 9)", NULL, 0},
        {0},
    };
    cli_parse(argc, argv, &a.cfg, options, argv[0],
              "Tensor parallelism: y = W x split by rows and by columns, a Megatron"
              " transformer block, and the whole model trained with TP.");
    if (a.cfg.precision != PRECISION_FP32 && !runs_part(&a, PART_TRAIN))
        cli_fail("--precision %s: parts 1 and 2 show the split arithmetic in fp32; it applies"
                 " to --part train (or all)", precision_name(a.cfg.precision));
    const int world = a.cfg.comm.ranks;
    char err[512];
    if (!tp_check_sizes(&a.cfg, world, a.tp, err, sizeof err)) {
        cli_fail("%s", err);   /* one line, from the first process */
    }
    if (a.tp == 0) a.tp = world;
    if (a.sp && !runs_part(&a, PART_TRAIN))
        cli_fail("--sp does nothing with --part %s (it splits part 3's training along the"
                 " sequence)", part_names[a.part]);
    if (a.sp && !tp_sequence_check(&a.cfg, a.tp, err, sizeof err)) {
        cli_fail("%s", err);
    }
    fits_check_or_exit(&a.cfg, 1.0 / a.tp);   /* a TP group holds one copy of the model */

    dataset *data = dataset_from_config(&a.cfg);
    a.data = data;
    baseline_run *baseline = NULL;
    if (runs_part(&a, PART_TRAIN) && process_hosts_rank0()) {
        run_config quiet = a.cfg;
        quiet.quiet = 1;   /* its table row and final loss are shown in part 3 */
        baseline = baseline_reference(&quiet, data);
        baseline->result.strategy = "baseline";
    }
    a.baseline = baseline;
    a.run.extra = &a.run_extra;
    if (runs_part(&a, PART_TRAIN)) strategy_outcome_alloc(&a.run, &a.cfg);
    int status = launch(&a.cfg.comm, rank_main, &a);
    strategy_outcome_free(&a.run);
    baseline_free(baseline);
    dataset_free(data);
    return status;
}
