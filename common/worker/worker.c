/* worker.c: a worker daemon's life: boot (options, model, engine, pool, data plane), the
 * heartbeat timer, drain on SIGTERM, and the orderly close. The role table (prefill/, decode/)
 * supplies what differs. */
#include "td_error.h"
#include "td_log.h"
#include "td_util.h"
#include "td_worker.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool closed_all;

static void on_kvx_closed(void *arg)
{
    (void)arg;
    closed_all = true;
}

static void on_disk_closed(void *arg)
{
    td_worker_t *w = arg;
    td_kvx_close(w->kvx, on_kvx_closed, w);
}

/* Close every handle once nothing is left to finish. */
static void finish_stop(td_worker_t *w)
{
    if (!w->stopping || w->stopped)
        return;
    TD_LOG_I("stopped: every request finished or canceled");
    w->stopped = true;
    uv_close((uv_handle_t *)&w->hb_timer, NULL);
    td_wk_routers_stop(w);
    td_wk_index_stop(w);
    td_http_server_close(w->http);
    td_wk_compute_close(w);
    td_wk_disk_close(w, on_disk_closed, w); /* its last stores let go of pool blocks */
    td_daemon_close(w->daemon);
}

static void on_hb_timer(uv_timer_t *t)
{
    td_worker_t *w = t->data;
    double now = td_now_s();
    td_wk_send_heartbeats(w);
    td_wk_index_renew(w);
    if (w->role->sweep)
        w->role->sweep(w, now);
    td_wk_schedule(w); /* blocks freed by late completions (a dead sequence's pushes) */
    if (!w->stopping)
        return;
    td_wk_seq_t *next;
    if (now >= w->stop_deadline)
        for (td_wk_seq_t *s = w->head; s; s = next) {
            next = s->next;
            if (!s->dead)
                td_wk_seq_fail(w, s, TD_ECANCELED, "the worker is shutting down");
        }
    bool busy = td_wk_compute_busy(w);
    for (td_wk_seq_t *s = w->head; s && !busy; s = s->next)
        busy = !s->dead || s->in_step || s->pushes_out > 0 || s->loads_out > 0;
    if (!busy)
        finish_stop(w);
}

static void on_stop(td_daemon_t *d, int signum, void *ud)
{
    td_worker_t *w = ud;
    if (w->stopping) {
        TD_LOG_W("second signal %d: canceling everything now", signum);
        w->stop_deadline = 0;
        return;
    }
    TD_LOG_I("signal %d: draining (at most %.1f s)", signum, w->cfg.drain_timeout_s);
    td_daemon_stopping(d);
    w->stopping = w->draining = true;
    w->stop_deadline = td_now_s() + w->cfg.drain_timeout_s;
    td_wk_send_heartbeats(w);
}

static void usage(FILE *out, const void *ud)
{
    const td_worker_role_t *r = ud;
    fprintf(out,
            "usage: tandem-%s --model DIR [--config FILE] [--section.key=value ...]\n\n"
            "The %s worker of a tandem cluster: registers with every router in `routers`,\n"
            "takes %s.\nIt serves /metrics and /health on http.listen.\n\n",
            r->name, r->name, r->takes);
}

/* Model, pool, data plane and engine. */
static int load(td_worker_t *w)
{
    td_wk_cfg_t *c = &w->cfg;
    int rc;
    if (!c->model || !*c->model)
        return td_err_set(TD_EINVAL, "model: required (a model directory)");
    if ((rc = td_rpc_secret_load(c->secret, c->secret_file, &w->secret, &w->secret_len)))
        return rc;
    td_path_basename(c->model, w->model_name, sizeof(w->model_name));
    if ((rc = td_model_load(c->model, &w->model)))
        return rc;
    w->mc = &w->model->cfg;
    if ((rc = td_kv_layout_init(&w->layout, w->model, (int)c->block_size)))
        return rc;
    if (w->layout.block_bytes % 64)
        return td_err_set(TD_EINVAL,
                          "kv.block_size: %lld tokens make blocks of %zu bytes; the data plane "
                          "needs a multiple of 64",
                          (long long)c->block_size, w->layout.block_bytes);
    uint64_t blocks = c->kv_blocks ? c->kv_blocks : c->kv_memory / w->layout.block_bytes;
    if (blocks < 1 || blocks > INT32_MAX)
        return td_err_set(TD_EINVAL, "kv.memory: %llu bytes hold %llu blocks of %zu bytes",
                          (unsigned long long)c->kv_memory, (unsigned long long)blocks,
                          w->layout.block_bytes);
    td_kvx_layout_t xl = {.block_bytes = w->layout.block_bytes, .n_blocks = (uint32_t)blocks};
    memcpy(xl.fingerprint, w->layout.fingerprint, 16);
    td_kvx_opts_t xo = {.on_recv = w->role->on_kv_recv, .on_fetch = td_wk_fetch_serve, .arg = w};
    if (!(w->kvx = td_kvx_new(w->loop, &xl, &xo)))
        return td_err_set(TD_EIO, "data plane: %s", td_err_msg());
    if ((rc = td_kv_pool_init_mem(&w->pool, &w->layout, (int)blocks, td_kvx_pool(w->kvx))))
        return rc;
    if (td_str_eq(c->engine_kind, "sim")) {
        w->sim = true;
        TD_LOG_W("SIMULATED engine: no model math; step times come from the sim.* options");
        return td_engine_create_sim(w->model, &c->sim, &w->engine);
    }
    if (!td_str_eq(c->engine_kind, "cpu"))
        return td_err_set(TD_EINVAL, "engine.kind: \"%s\" is not cpu or sim", c->engine_kind);
    /* before the engine exists: nothing reads the mappings yet. A failure leaves them usable. */
    if (c->hugepage_weights && td_model_weights_to_anon(w->model))
        TD_LOG_W("engine.hugepage_weights: the weights stay in the file mapping: %s", td_err_msg());
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    td_engine_opts_t eo = {.n_threads = c->threads > 0 ? (int)c->threads : (int)TD_MAX(cores, 1),
                           .stored_rows = !c->grouped_weights};
    return td_engine_create(w->model, &eo, &w->engine);
}

static int start(td_worker_t *w)
{
    int rc;
    if ((rc = load(w)) || (rc = td_wk_disk_open(w)) || (rc = td_wk_metrics_init(w)) ||
        (rc = td_wk_compute_start(w)) || (rc = td_wk_index_start(w)) || (rc = td_wk_admin_start(w)) ||
        (rc = td_wk_routers_start(w)))
        return rc;
    uv_timer_init(w->loop, &w->hb_timer);
    w->hb_timer.data = w;
    uint64_t ms = (uint64_t)(w->cfg.heartbeat_s * 1000);
    uv_timer_start(&w->hb_timer, on_hb_timer, ms, ms ? ms : 1);
    return 0;
}

/* Start-up failed: close what exists and let the loop release it. */
static void close_partial(td_worker_t *w)
{
    td_wk_routers_stop(w);
    td_wk_index_stop(w);
    if (w->http)
        td_http_server_close(w->http);
    if (w->hb_timer.data)
        uv_close((uv_handle_t *)&w->hb_timer, NULL);
    td_wk_compute_close(w);
    td_wk_disk_close(w, NULL, NULL);
    if (w->kvx)
        td_kvx_close(w->kvx, NULL, NULL);
    if (w->daemon)
        td_daemon_close(w->daemon);
    uv_run(w->loop, UV_RUN_DEFAULT);
}

int td_worker_main(const td_worker_role_t *role, int argc, char **argv)
{
    td_worker_t *w = td_calloc(1, sizeof(*w));
    if (!w)
        return 1;
    w->role = role;
    char program[64];
    snprintf(program, sizeof(program), "tandem-%s", role->name);
    td_daemon_boot_t boot = {.program = program,
                             .component = role->name,
                             .env_prefix = role->env_prefix,
                             .opts = td_wk_opts,
                             .n_opts = td_wk_n_opts,
                             .cfg = &w->cfg,
                             .usage = usage,
                             .ud = role};
    int status;
    if (td_daemon_boot(&boot, argc, argv, &status)) {
        free(w);
        return status;
    }
    if (!w->cfg.id || !*w->cfg.id) {
        char host[128] = "localhost", id[256];
        gethostname(host, sizeof(host) - 1);
        snprintf(id, sizeof(id), "%s-%s-%d", role->name, host, (int)getpid());
        free(w->cfg.id);
        w->cfg.id = td_strdup(id);
    }
    uv_loop_t loop;
    uv_loop_init(&loop);
    w->loop = &loop;
    status = 1;
    int rc;
    if (!(w->daemon = td_daemon_start(&loop, on_stop, w))) {
        fprintf(stderr, "%s: out of memory\n", program);
    } else if ((rc = start(w))) {
        fprintf(stderr, "%s: %s\n", program, td_err_msg());
    } else {
        /* one parseable line for scripts and tests */
        printf("%s: id=%s http=127.0.0.1:%d blocks=%d block_bytes=%zu engine=%s\n", program,
               w->cfg.id, td_http_port(w->http), w->pool.n_blocks, w->layout.block_bytes,
               w->sim ? "SIMULATED" : "cpu");
        fflush(stdout);
        /* READY=1 comes with the first registration (routers.c): until then `systemctl start`
         * waits and the unit is "activating" with this status */
        td_daemon_status(w->daemon, "model loaded; registering with %s", w->cfg.routers);
        TD_LOG_I("%s worker %s ready: model %s, %d KV blocks of %d tokens", role->name,
                 w->cfg.id, w->model_name, w->pool.n_blocks, w->layout.block_size);
        uv_run(&loop, UV_RUN_DEFAULT);
        status = closed_all ? 0 : 1;
    }
    td_wk_compute_join(w);
    if (!closed_all)
        close_partial(w);
    uv_loop_close(&loop);
    while (w->head) {
        td_wk_seq_t *s = w->head;
        s->in_step = false;
        s->pushes_out = 0;
        s->state = TD_WK_RUN;
        td_wk_seq_maybe_free(w, s);
    }
    td_kv_pool_free(&w->pool);
    td_engine_free(w->engine);
    td_wk_structured_free(w);
    td_model_free(w->model);
    td_wk_metrics_free(w);
    free(w->items);
    free(w->logits);
    free(w->secret);
    td_config_free(td_wk_opts, td_wk_n_opts, &w->cfg);
    free(w);
    return status;
}
