/* bench_driver.c: the open-loop driver of one `tandem bench` phase: one libuv loop, a timerfd for
 * sub-millisecond send times, the multi-turn ready queue, and the progress line. */
#include "bench_cmd_impl.h"
#include "td_error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/timerfd.h>
#include <unistd.h>
#include <uv.h>

static void dispatch(driver_t *d);

/* Point the timerfd at the next arrival (or disarm it). Setting a timerfd also clears its
 * expirations, so it is never read; it is only set when the deadline changes. */
static void arm(driver_t *d)
{
    uint64_t at = d->arrived < d->n ? d->t0 + (uint64_t)(d->arrivals[d->arrived] * 1e9) : 0;
    if (at == d->armed_ns)
        return;
    struct itimerspec its = {{0, 0}, {(time_t)(at / 1000000000ULL), (long)(at % 1000000000ULL)}};
    timerfd_settime(d->tfd, TFD_TIMER_ABSTIME, &its, NULL); /* at 0: disarm */
    d->armed_ns = at;
}

/* Count the arrivals that are due, send what may be sent, aim the timer at the next one. Runs
 * when the timer fires and after every other loop iteration too (uv_check), so a busy loop
 * sends on time without waking through the timer. */
static void advance(driver_t *d)
{
    double now = (double)(td_now_ns() - d->t0) * 1e-9;
    while (d->arrived < d->n && d->arrivals[d->arrived] <= now)
        d->arrived++;
    dispatch(d);
    arm(d);
}

static void on_timer(uv_poll_t *p, int status, int events)
{
    driver_t *d = p->data;
    d->armed_ns = UINT64_MAX; /* it fired: set it again even for the same deadline */
    advance(d);
}

static void on_check(uv_check_t *c)
{
    advance(c->data);
}

static int msg_escape(td_buf_t *b, const char *role, const char *text, size_t n)
{
    int rc = td_buf_printf(b, "{\"role\": \"%s\", \"content\": ", role);
    rc |= td_buf_append_json_string(b, text, n);
    rc |= td_buf_append_char(b, '}');
    return rc ? TD_ENOMEM : 0;
}

static void send_one(driver_t *d, size_t pi)
{
    const td_bench_prompt_t *p = &d->wl->prompts[pi];
    size_t slot = d->sent++;
    td_bench_result_t *r = &d->results[slot];
    td_bench_result_init(r);
    /* reserve what the answer will need up front so that streaming it allocates nothing per
     * token (the arrays still grow by doubling if a server sends more) */
    size_t expect = (size_t)TD_MAX(p->output_len, 1);
    r->itl = td_calloc(expect, sizeof(double));
    r->cap_itl = r->itl ? expect : 0;
    td_buf_reserve(&r->text, expect * 8);
    r->sched_s = d->arrivals[slot];
    d->prompt_of[slot] = pi;
    r->prompt_len = p->prompt_len;
    td_bench_request_t req = {d->o->model,   p->text,          NULL,
                              p->output_len, d->o->ignore_eos, d->o->stream};
    int rc = 0;
    if (d->o->chat) {
        td_buf_reset(&d->msg);
        rc |= td_buf_append_char(&d->msg, '[');
        if (p->session >= 0 && !d->warmup && d->hist[p->session].len) {
            rc |= td_buf_append(&d->msg, d->hist[p->session].data, d->hist[p->session].len);
            rc |= td_buf_append_str(&d->msg, ", ");
        }
        rc |= msg_escape(&d->msg, "user", p->text, strlen(p->text));
        rc |= td_buf_append_char(&d->msg, ']');
        req.messages_json = d->msg.data;
    }
    if (p->session >= 0 && p->turn > 0 && !d->warmup) {
        /* prompt tokens of a later turn: every earlier user message and answer (the chat
         * template's own tokens are not counted) */
        r->prompt_len += d->hist_tok[p->session];
    }
    if (rc == 0)
        rc = d->be->submit(d->impl, &req, d->t0, r);
    if (rc != 0) {
        r->send_s = (double)(td_now_ns() - d->t0) * 1e-9;
        td_bench_result_fail(r, TD_BENCH_ERR_CONNECT, "submit: %s", td_err_msg());
        d->done++;
        d->errors++;
        if (d->done == d->n) {
            uv_poll_stop(&d->poll);
            uv_timer_stop(&d->prog);
            uv_check_stop(&d->check);
            uv_stop(d->loop);
        }
    }
}

static bool multi_turn(const driver_t *d)
{
    return d->wl->num_sessions > 0 && !d->warmup;
}

static void dispatch(driver_t *d)
{
    while (d->sent < d->arrived) {
        if (d->o->max_concurrency > 0 && d->be->inflight(d->impl) >= (size_t)d->o->max_concurrency)
            return;
        size_t pi;
        if (multi_turn(d)) {
            if (d->ready_head == d->ready_tail)
                return; /* every session waits for an answer: the arrival waits too */
            pi = d->ready[d->ready_head++];
        } else {
            pi = d->next_prompt++ % d->wl->n;
        }
        send_one(d, pi);
    }
}

void td__bench_on_done(td_bench_result_t *r, void *arg)
{
    driver_t *d = arg;
    size_t slot = (size_t)(r - d->results);
    const td_bench_prompt_t *p = &d->wl->prompts[d->prompt_of[slot]];
    if (r->err == TD_BENCH_OK) {
        if (r->usage_completion_tokens >= 0) {
            r->output_len = r->usage_completion_tokens;
        } else if (d->tok) { /* vLLM: count the generated text with the tokenizer */
            td_tokens_t t;
            td_tokens_init(&t);
            td_tokenizer_encode(d->tok, r->text.data ? r->text.data : "", r->text.len, false, &t);
            r->output_len = (int64_t)t.len;
            td_tokens_free(&t);
        } else {
            r->output_len = r->n_chunks;
        }
        d->out_tokens += r->output_len;
    } else {
        d->errors++;
    }
    if (multi_turn(d) && p->session >= 0) {
        td_buf_t *h = &d->hist[p->session];
        if (h->len)
            td_buf_append_str(h, ", ");
        msg_escape(h, "user", p->text, strlen(p->text));
        td_buf_append_str(h, ", ");
        msg_escape(h, "assistant", r->text.data ? r->text.data : "", r->text.len);
        d->hist_tok[p->session] += p->prompt_len + (r->err == TD_BENCH_OK ? r->output_len : 0);
        /* the next turn of this session becomes ready (prompts are turn-major) */
        size_t k = d->prompt_of[slot] + (size_t)d->wl->num_sessions;
        if (k < d->wl->n && d->wl->prompts[k].session == p->session)
            d->ready[d->ready_tail++] = k;
    }
    d->done++;
    if (d->done == d->n) {
        uv_poll_stop(&d->poll);
        uv_timer_stop(&d->prog);
        uv_check_stop(&d->check);
        uv_stop(d->loop); /* idle keep-alive connections would keep the loop running */
        return;
    }
    dispatch(d);
}

static void progress_line(driver_t *d, bool final)
{
    double now = (double)(td_now_ns() - d->t0) * 1e-9;
    double dt = now - d->last_prog_s;
    double tput = dt > 0 ? (double)(d->out_tokens - d->last_out_tokens) / dt : 0;
    d->last_prog_s = now;
    d->last_out_tokens = d->out_tokens;
    const char *ph = d->warmup ? "warm-up" : "run";
    if (d->tty)
        printf("\r\033[K%s %6.1fs  done %zu/%zu  in flight %zu  errors %zu  %.0f tok/s%s", ph, now,
               d->done, d->n, d->be->inflight(d->impl), d->errors, tput, final ? "\n" : "");
    else
        printf("progress: %s t=%.1fs done=%zu/%zu inflight=%zu errors=%zu output_tok_per_s=%.0f\n",
               ph, now, d->done, d->n, d->be->inflight(d->impl), d->errors, tput);
    fflush(stdout);
}

static void on_prog(uv_timer_t *t)
{
    progress_line(t->data, false);
}

/* Run one phase to completion. */
int td__bench_run_phase(driver_t *d)
{
    d->t0 = td_now_ns();
    d->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (d->tfd < 0)
        return td_err_set(TD_EIO, "timerfd_create failed");
    uv_poll_init(d->loop, &d->poll, d->tfd);
    d->poll.data = d;
    uv_timer_init(d->loop, &d->prog);
    d->prog.data = d;
    d->tty = isatty(1);
    if (d->o->progress)
        uv_timer_start(&d->prog, on_prog, d->tty ? 500 : 5000, d->tty ? 500 : 5000);
    uv_check_init(d->loop, &d->check);
    d->check.data = d;
    uv_check_start(&d->check, on_check);
    uv_unref((uv_handle_t *)&d->check);
    d->armed_ns = 0;
    uv_poll_start(&d->poll, UV_READABLE, on_timer);
    arm(d);
    uv_run(d->loop, UV_RUN_DEFAULT);
    if (d->o->progress)
        progress_line(d, true);
    uv_close((uv_handle_t *)&d->poll, NULL);
    uv_close((uv_handle_t *)&d->prog, NULL);
    uv_close((uv_handle_t *)&d->check, NULL);
    uv_run(d->loop, UV_RUN_NOWAIT); /* the close callbacks */
    close(d->tfd);
    return 0;
}
