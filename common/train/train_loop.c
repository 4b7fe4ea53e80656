#include "train_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc.h"
#include "compare.h"
#include "fp8_linear.h"
#include "loss_scale.h"
#include "op_profile.h"
#include "ops.h"
#include "restart.h"
#include "resume_source.h"

/* a - b, kind by kind: the strategy's traffic without the loop's own */
static comm_stats stats_minus(comm_stats a, const comm_stats *b) {
    for (int k = 0; k < COMM_NKINDS; k++) {
        a.calls[k] -= b->calls[k];
        a.bytes_sent[k] -= b->bytes_sent[k];
        a.bytes_received[k] -= b->bytes_received[k];
        a.seconds[k] -= b->seconds[k];
    }
    a.async_seconds -= b->async_seconds;
    a.hidden_seconds -= b->hidden_seconds;
    for (int t = 0; t < COMM_NTIERS; t++) a.tier_sent[t] -= b->tier_sent[t];
    return a;
}

static void fill_comm(run_result *r, comm *world, comm *metrics) {
    if (!world) return;
    const comm_stats metrics_stats = comm_stats_get(metrics);
    const comm_stats s = stats_minus(comm_stats_all(world), &metrics_stats);
    r->comm_seconds = comm_stats_total_seconds(&s);
    r->hidden_seconds = s.hidden_seconds;
    r->bytes_sent_per_step =
        r->timed_steps > 0 ? (double)comm_stats_total_sent(&s) / r->timed_steps : 0;
    for (int t = 0; t < COMM_NTIERS; t++)
        r->tier_bytes_per_step[t] =
            r->timed_steps > 0 ? (double)s.tier_sent[t] / r->timed_steps : 0;
}

/* The lowest rank of `metrics` whose own share of the loss is not finite (the global
 * loss is not finite, so every rank takes part in finding it). */
/* FP8's per-tensor amax of an activation, the largest over the ranks (fp8_linear.h) */
static float amax_over(void *metrics, float amax) {
    comm_allreduce(metrics, &amax, 1, COMM_F32, COMM_MAX);
    return amax;
}

static int first_rank_not_finite(comm *metrics, float own_loss) {
    const int size = comm_size(metrics);
    float mark = isfinite(own_loss) ? 0.0f : (float)(size - comm_rank(metrics));
    comm_allreduce(metrics, &mark, 1, COMM_F32, COMM_MAX);
    return mark > 0 ? size - (int)mark : 0;
}

/* One line, and the run stops: every rank, through the communicator's failure path
 * (the others stop at their next collective, which sees the failure); on one device,
 * exit status 1. */
static void stop_run(comm *metrics, const char *why) {
    if (!metrics) {
        fflush(stdout);
        fprintf(stderr, "error: %s\n", why);
        exit(1);
    }
    if (comm_rank(metrics) == 0) comm_abort(metrics, "%s", why);
}

/* Training that has diverged teaches nothing and compares with nothing: one line, and
 * the run stops (every rank, through the communicator's failure path). */
static void stop_if_diverged(comm *metrics, const run_config *cfg, const char *strategy,
                             int step, float own_loss, float loss) {
    if (isfinite(loss)) return;
    char why[256];
    const int rank = metrics ? first_rank_not_finite(metrics, own_loss) : 0;
    snprintf(why, sizeof why, "training diverged: the loss is %s at step %d on rank %d"
             " (strategy %s); try a smaller --lr than %g", isnan(loss) ? "nan" : "inf", step,
             rank, strategy, (double)cfg->adamw.lr);
    stop_run(metrics, why);
}

/* fp16's loss scale from the flags: on for fp16 unless --no-loss-scale. The command line
 * refused a start that cannot run; a config that fails the check anyway stops the run. */
static void loss_scale_from_config(comm *metrics, const run_config *cfg, loss_scale *s) {
    loss_scale_config c = loss_scale_defaults(cfg->precision);
    if (cfg->no_loss_scale) c.enabled = 0;
    if (cfg->loss_scale_init > 0) c.init_scale = (float)cfg->loss_scale_init;
    if (cfg->loss_scale_window > 0) c.growth_interval = cfg->loss_scale_window;
    char why[160], line[200];
    if (loss_scale_init(s, &c)) return;
    loss_scale_config_check(&c, why, sizeof why);
    snprintf(line, sizeof line, "the loss scale cannot run: %s", why);
    stop_run(metrics, line);
}

/* After compute_grads with dloss x `used`: are every rank's gradients finite (one flag
 * reduced over all of them)? Then unscale them and return 1 (take the step); else 0,
 * and the scale backs off. Without a loss scale: 1. */
static int loss_scale_step(comm *metrics, const run_config *cfg, const train_strategy *st,
                           loss_scale *s, int step, float used) {
    if (!s->cfg.enabled) return 1;
    grad_vector vectors[TRAIN_MAX_GRAD_VECTORS];
    const int count = st->optimizer_grads(st->ctx, vectors);
    if (step == cfg->test_overflow_step && count > 0 && vectors[0].length > 0 &&
        (!metrics || comm_world_rank(metrics) == 0))
        grad_vector_overflow_first(&vectors[0]);
    int finite = 1;
    for (int i = 0; i < count; i++) finite &= grad_vector_finite(&vectors[i]);
    const int take = loss_scale_update(s, loss_scale_all_finite(metrics, finite));
    if (take)
        for (int i = 0; i < count; i++) grad_vector_unscale(&vectors[i], 1.0f / used);
    return take;
}

/* The strategy's state for checkpoints, when the flags ask for one. A program whose
 * strategies keep none sets run_config.no_checkpoints, and the command line refuses
 * --save and --resume there: one that did not is this code's bug. */
static void checkpoint_state_of(const run_config *cfg, const train_strategy *st,
                                ckpt_state *state) {
    memset(state, 0, sizeof *state);
    if (!cfg->save_dir && !cfg->resume_dir) return;   /* resume_base comes with resume_dir */
    if (!st->checkpoint_state) {
        fprintf(stderr, "--save/--resume: strategy %s has no checkpoints (and the program"
                " set no run_config.no_checkpoints)\n", st->name);
        abort();
    }
    st->checkpoint_state(st->ctx, state);
}

/* --resume: fp16's loss scale continues from the checkpoint's when both runs are fp16
 * with a dynamic scale; any other pair starts the scale afresh (loss_scale_init's). The
 * reporting rank says so in the line that names the checkpoint. */
static void resume_loss_scale(const run_config *cfg, const char *from, int reports, int done,
                              const ckpt_run_state *saved, loss_scale *s) {
    if (!from) return;
    const int restored = s->cfg.enabled && saved->has_loss_scale &&
                         saved->precision == PRECISION_FP16;
    if (restored) {
        s->scale = saved->loss_scale;
        s->clean_steps = saved->clean_steps;
        s->skipped_steps = saved->skipped_steps;
    }
    if (!reports || cfg->quiet) return;
    checkpoint_print_resumed(stderr, from, done, saved, restored);
    if (done >= cfg->steps)   /* a restart finds this strategy had finished */
        fprintf(stderr, "checkpoint: step %d is the last (--steps): nothing left to train\n",
                done);
}

static void warn_fp8_resume(const run_config *cfg, const char *from, int reports,
                            const ckpt_run_state *saved);

/* fp16's loss scale at the start of this run: from the flags, or the checkpoint's. 0,
 * with why, for a strategy that cannot take one (no optimizer_grads): the command line
 * keeps fp16 from it (DataParallel), so this is the caller's mistake, not the user's.
 * The scale is then off, so that the ranks the caller does not stop at once reach their
 * next collective, where the failure stops them. */
static int loss_scale_start(comm *metrics, const run_config *cfg, const train_strategy *st,
                            const char *from, int reports, int done,
                            const ckpt_run_state *saved, loss_scale *s, char *why,
                            size_t why_size) {
    loss_scale_from_config(metrics, cfg, s);
    if (s->cfg.enabled && !st->optimizer_grads) {
        snprintf(why, why_size, "strategy %s takes no loss scale (it hands the training loop"
                 " no gradients to unscale)", st->name);
        s->cfg.enabled = 0;
        return 0;
    }
    resume_loss_scale(cfg, from, reports, done, saved, s);
    warn_fp8_resume(cfg, from, reports, saved);
    return 1;
}

/* What a save records besides the tensors: the precision (FP8's recipe too) and the
 * loss scale's state. */
static void record_run_state(const run_config *cfg, const loss_scale *s, ckpt_run_state *run) {
    fp8_recipe recipe = FP8_BLOCKWISE;
    const int fp8 = cfg->precision == PRECISION_BF16 && fp8_linear_active(&recipe);
    *run = (ckpt_run_state){.precision = cfg->precision, .has_loss_scale = s->cfg.enabled,
                            .loss_scale = s->scale, .clean_steps = s->clean_steps,
                            .skipped_steps = s->skipped_steps, .fp8 = fp8,
                            .fp8_recipe = (int)recipe, .fp8_format = (int)fp8_linear_format_now()};
}

/* --resume across FP8 recipes: the fp32 weights carry over whatever computed them, but
 * the FP8 scales are this run's, and delayed's amax history is not saved. One line. */
static void warn_fp8_resume(const run_config *cfg, const char *from, int reports,
                            const ckpt_run_state *saved) {
    ckpt_run_state now;
    const loss_scale none = {0};
    record_run_state(cfg, &none, &now);
    const int differs = now.fp8 != saved->fp8 || (now.fp8 && (now.fp8_recipe != saved->fp8_recipe ||
                                                              now.fp8_format != saved->fp8_format));
    const int delayed = now.fp8 && now.fp8_recipe == FP8_DELAYED;
    if (!from || !reports || (!differs && !delayed)) return;
    char was[48], is[48];
    snprintf(was, sizeof was, "%s%s%s", saved->fp8 ? fp8_recipe_name((fp8_recipe)saved->fp8_recipe)
             : precision_name(saved->precision), saved->fp8 ? " " : "",
             saved->fp8 ? fp8_training_format_name((fp8_training_format)saved->fp8_format) : "");
    snprintf(is, sizeof is, "%s%s%s", now.fp8 ? fp8_recipe_name((fp8_recipe)now.fp8_recipe)
             : precision_name(cfg->precision), now.fp8 ? " " : "",
             now.fp8 ? fp8_training_format_name((fp8_training_format)now.fp8_format) : "");
    fprintf(stderr, "checkpoint: warning: saved %s%s, resumed %s%s: the weights carry over,"
            " the FP8 scales start afresh%s\n", saved->fp8 ? "in fp8 " : "in ", was,
            now.fp8 ? "in fp8 " : "in ", is, delayed ? " (delayed's amax history is not saved)" : "");
}

static int save_due(const run_config *cfg, int step) {
    return cfg->save_dir &&
           (step == cfg->steps || (cfg->save_every > 0 && step % cfg->save_every == 0));
}

/* The checkpoint this strategy resumes from (resume_source.c) into from; NULL when
 * none (step 0). */
static const char *resume_from(const run_config *cfg, const char *strategy, char *from,
                               size_t from_len) {
    char err[1024];
    const int found = resume_source(cfg, strategy, from, from_len, err, sizeof err);
    if (found < 0) {   /* it was sound when the program started: changed since */
        fprintf(stderr, "checkpoint: %s\n", err);
        exit(1);
    }
    return found ? from : NULL;
}

/* --resume: the state of the checkpoint this strategy resumes from (*from; NULL: none)
 * into the strategy's; returns its step. Timed, and this attempt's start noted, for the
 * cost of a restart (restart.h). */
static int load_checkpoint(const run_config *cfg, comm *world, const char *strategy,
                           const ckpt_state *state, char *path, size_t path_len,
                           const char **from) {
    *from = resume_from(cfg, strategy, path, path_len);
    const double start = comm_now();
    const int done = *from ? restart_resumed_step(cfg, checkpoint_load(*from, state)) : 0;
    restart_loop_start(cfg, world, strategy, done, comm_now() - start);
    return done;
}

/* The strategy's checkpoint state, with the checkpoint it resumes from loaded. */
static int start_state(const run_config *cfg, comm *world, const train_strategy *st,
                       ckpt_state *state, ckpt_run_state *run, char *path, size_t path_len,
                       const char **from) {
    checkpoint_state_of(cfg, st, state);
    state->run = run;
    return load_checkpoint(cfg, world, st->name, state, path, path_len, from);
}

/* The fastest of the timed steps: all but the warm-up step, or the only one (0: none). */
static double fastest_timed_step(const double *step_seconds, int steps) {
    if (steps <= 0) return 0.0;
    double fastest = step_seconds[steps > 1 ? 1 : 0];
    for (int i = 2; i < steps; i++)
        if (step_seconds[i] < fastest) fastest = step_seconds[i];
    return fastest;
}

/* Step 1's gradients gathered for the comparison: checking traffic, left out of the
 * statistics (a one-step run has no warm-up step whose reset would drop it). */
static void keep_first_grads_uncounted(comm *world, const train_strategy *st) {
    if (world) comm_stats_pause(world, 1);
    st->keep_first_grads(st->ctx);
    if (world) comm_stats_pause(world, 0);
}

/* After the warm-up step, what the timed steps measure starts afresh. */
static void reset_after_warmup(const train_strategy *st, comm *world, mem_stats *mem,
                             op_profile *profile) {
    if (st->after_warmup) st->after_warmup(st->ctx);
    if (world) comm_stats_reset(world);
    mem_stats_reset_peaks(mem);
    if (profile) op_profile_clear(profile);
}

void train_loop(comm *world, const run_config *cfg, double tokens_per_step,
                const train_strategy *st, train_outcome *out) {
    const int reports = !world || comm_world_rank(world) == 0;
    comm *metrics = world ? comm_split(world, 0, comm_rank(world), "metrics") : NULL;
    fp8_linear_group(metrics ? amax_over : NULL, metrics);   /* world: a dp group where FP8 trains */
    ckpt_state state;
    ckpt_run_state run_state = {.precision = cfg->precision};
    char from_path[4096];
    const char *from;
    const int done = start_state(cfg, world, st, &state, &run_state, from_path,
                                 sizeof from_path, &from);
    const int steps = done < cfg->steps ? cfg->steps - done : 0;   /* done + 1 .. cfg->steps */
    memset(out, 0, sizeof *out);
    /* through the accounting allocator: a rank stopped by a failure gives them back */
    out->loss = mem_alloc(MEM_OTHER, (size_t)steps * sizeof(float));
    out->step_seconds = mem_alloc(MEM_OTHER, (size_t)steps * sizeof(double));
    mem_stats *mem = mem_stats_current();
    double timed = 0;
    int timed_steps = 0;
    op_profile *profile = cfg->profile ? mem_alloc(MEM_OTHER, sizeof *profile) : NULL;
    if (profile) op_profile_start(profile, cfg->precision);
    loss_scale scale;
    char why[200];
    if (!loss_scale_start(metrics, cfg, st, from, reports, done, &run_state, &scale, why,
                          sizeof why))
        stop_run(metrics, why);
    if (steps == 1 && world) comm_stats_reset(world);   /* no warm-up reset follows it */
    for (int i = 1; i <= steps; i++) {
        const int step = done + i;
        restart_maybe_fail(cfg, world, st->name, step);
        double start = comm_now();
        const float used = scale.scale;
        float loss = st->compute_grads(st->ctx, step, used);
        const int take = loss_scale_step(metrics, cfg, st, &scale, step, used);
        if (cfg->loss_scale_trace && (!metrics || comm_world_rank(metrics) == 0))
            cfg->loss_scale_trace[i - 1] = used;
        double seconds = comm_now() - start;
        if (i == 1 && st->keep_first_grads) keep_first_grads_uncounted(world, st);
        start = comm_now();
        if (take) st->update(st->ctx, step);
        ops_synchronize();
        seconds += comm_now() - start;
        const float own_loss = loss;
        if (metrics) comm_allreduce(metrics, &loss, 1, COMM_F32, COMM_SUM);
        stop_if_diverged(metrics, cfg, st->name, step, own_loss, loss);
        out->loss[i - 1] = loss;
        out->step_seconds[i - 1] = seconds;
        if (reports) report_step(cfg, st->name, step, loss, seconds, tokens_per_step);
        if (i > 1 || steps == 1) {
            timed += seconds;
            timed_steps++;
        }
        if (i == 1 && steps > 1) reset_after_warmup(st, world, mem, profile);
        restart_step_done(cfg, world, step);   /* before its save: a failed save loses it */
        /* over the metrics group, whose traffic the strategy's statistics leave out */
        if (save_due(cfg, step)) {
            record_run_state(cfg, &scale, &run_state);
            checkpoint_save(metrics, cfg, st->name, &state, step);
        }
    }
    restart_loop_end(cfg, world);
    if (profile) op_profile_stop(profile);
    run_result *r = &out->result;
    *r = (run_result){.strategy = st->name, .steps = steps, .loss = out->loss,
                      .diff_loss = -1, .diff_grads = -1, .diff_params = -1,
                      .seconds = timed, .timed_steps = timed_steps,
                      .tokens_per_step = tokens_per_step, .bytes_formula = -1,
                      .memory = *mem, .loss_scale = scale.scale,
                      .skipped_steps = scale.skipped_steps};
    fill_comm(r, world, metrics);
    r->fastest_step_seconds = fastest_timed_step(out->step_seconds, steps);
    if (profile)   /* --json keeps stdout one JSON object */
        r->sgemm_floor_seconds =
            op_profile_report(profile, metrics, st->name, timed_steps, timed,
                              r->fastest_step_seconds, r->comm_seconds,
                              cfg->json ? stderr : stdout);
    mem_free(profile);
    if (metrics) run_result_take_max(metrics, r);
    fp8_linear_group(NULL, NULL);
    comm_free(metrics);
}

static void *heap_copy(const void *src, size_t bytes) {
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) { fprintf(stderr, "error: out of memory\n"); exit(1); }
    memcpy(copy, src, bytes);
    return copy;
}

float *train_outcome_take_loss(train_outcome *out) {
    float *loss = heap_copy(out->loss, (size_t)out->result.steps * sizeof(float));
    mem_free(out->loss);
    out->loss = NULL;
    out->result.loss = loss;
    return loss;
}

double *train_outcome_take_step_seconds(train_outcome *out) {
    double *seconds = heap_copy(out->step_seconds, (size_t)out->result.steps * sizeof(double));
    mem_free(out->step_seconds);
    out->step_seconds = NULL;
    return seconds;
}

void train_outcome_free(train_outcome *out) {
    mem_free(out->loss);
    mem_free(out->step_seconds);
    memset(out, 0, sizeof *out);
}
