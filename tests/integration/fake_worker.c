/* fake_worker.c: a SCRIPTED worker and RPC client for testing tandem-router without an engine.
 * As a worker it speaks the real control protocol (td_rpc, Hello, Heartbeat, DecodeTask ->
 * DecodeAccept -> TokenChunk, PrefillTask -> PrefillDone, Cancel, Drain) but "generates" a fixed
 * list of token ids; no model, no KV cache. As a client it sends one GenerateRequest,
 * TokenizeRequest or StatusRequest on the router's internal RPC and prints what comes back.
 * Every event is one line on stdout (flushed) for tests/integration/router_test.py to read.
 * Test scaffolding, not a worker to deploy. */
#include "control.pb-c.h"
#include "td_error.h"
#include "td_log.h"
#include "td_rpc.h"
#include "td_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct opts {
    const char *role; /* prefill, decode, client */
    const char *addr, *secret, *id;
    int32_t tokens[256];
    size_t n_tokens;
    int chunk;       /* tokens per TokenChunk */
    int interval_ms; /* between chunks */
    int hb_ms;       /* heartbeat interval */
    const char *fp;  /* fingerprint text (bytes used as is) */
    int block_tokens, total_blocks;
    int error_code;     /* decode: answer every DecodeTask with Error(code) */
    int die_after;      /* decode: exit after sending this many tokens in all (0: never) */
    bool die_on_task;   /* decode: exit as soon as a DecodeTask arrives */
    int hang_after;     /* decode: go silent (no heartbeats, no tokens) after this many */
    int prefill_status; /* prefill: PrefillDone.status */
    int prefill_delay_ms;
    const char *model;
    /* client */
    const char *generate, *tokenize, *stop, *drain, *messages;
    bool status, undrain, want_text;
    int max_tokens, cancel_after, gen_logprobs;
} opts_t;

static opts_t o = {.chunk = 1,
                   .interval_ms = 5,
                   .hb_ms = 200,
                   .fp = "fp-default-0000",
                   .block_tokens = 16,
                   .total_blocks = 1000,
                   .model = "fake",
                   .gen_logprobs = -1};
static uv_loop_t *loop;
static td_rpc_client_t *client;
static uv_timer_t hb_timer;
static uint64_t hb_seq;
static int sent_total;
static bool silent;
static bool draining;
static int chunks_seen;

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

static void send_frame(Tandem__Frame *f)
{
    td_rpc_conn_t *c = td_rpc_client_conn(client);
    if (c)
        td_rpc_send(c, f);
}

/* ---- decode: one task streaming canned tokens ---------------------------------------------- */

typedef struct task {
    uv_timer_t timer;
    uint64_t id;
    int max_tokens, logprobs;
    size_t pos;
    uint32_t prompt;
    struct task *next;
} task_t;

static task_t *tasks;

/* prefill: one pending PrefillDone */
typedef struct pjob {
    uv_timer_t timer;
    uint64_t id;
} pjob_t;

static pjob_t *pjobs[1024];

static void task_closed(uv_handle_t *h)
{
    free(h->data);
}

static void task_end(task_t *t)
{
    for (task_t **pp = &tasks; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    uv_timer_stop(&t->timer);
    uv_close((uv_handle_t *)&t->timer, task_closed);
}

static void task_tick(uv_timer_t *tm)
{
    task_t *t = tm->data;
    if (silent)
        return;
    size_t limit = TD_MIN(o.n_tokens, (size_t)t->max_tokens);
    size_t n = TD_MIN((size_t)o.chunk, limit - t->pos);
    Tandem__TokenChunk c = TANDEM__TOKEN_CHUNK__INIT;
    Tandem__TokenLogprob lp[256], *lpp[256];
    int32_t top_ids[256][2];
    float top_lp[256][2];
    c.request_id = t->id;
    c.n_tokens = n;
    c.tokens = &o.tokens[t->pos];
    if (t->logprobs >= 0) {
        for (size_t i = 0; i < n; i++) {
            tandem__token_logprob__init(&lp[i]);
            lp[i].logprob = -0.5f;
            top_ids[i][0] = o.tokens[t->pos + i];
            top_ids[i][1] = 1000;
            top_lp[i][0] = -0.5f;
            top_lp[i][1] = -2.0f;
            size_t k = (size_t)TD_MIN(t->logprobs, 2);
            lp[i].n_top_ids = lp[i].n_top_logprobs = k;
            lp[i].top_ids = top_ids[i];
            lp[i].top_logprobs = top_lp[i];
            lpp[i] = &lp[i];
        }
        c.n_logprobs = n;
        c.logprobs = lpp;
    }
    t->pos += n;
    sent_total += (int)n;
    bool last = t->pos >= limit;
    if (last) {
        c.finish = o.n_tokens <= (size_t)t->max_tokens ? TANDEM__FINISH__FINISH_STOP
                                                       : TANDEM__FINISH__FINISH_LENGTH;
        c.prompt_tokens = t->prompt;
        c.cached_tokens = 0;
        c.completion_tokens = (uint32_t)t->pos;
    }
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_TOKEN_CHUNK;
    f.token_chunk = &c;
    send_frame(&f);
    if (o.die_after && sent_total >= o.die_after) {
        td_rpc_conn_t *conn = td_rpc_client_conn(client);
        if (conn) /* the chunk reaches the router before the crash */
            td_rpc_conn_flush(conn);
        say("dying");
        _exit(0);
    }
    if (o.hang_after && sent_total >= o.hang_after) {
        say("hanging");
        silent = true;
        return;
    }
    if (last) {
        say("finished id=%llu n=%zu", (unsigned long long)t->id, t->pos);
        task_end(t);
    }
}

static void on_decode_task(const Tandem__DecodeTask *d)
{
    const Tandem__Sampling *sp = d->sampling;
    say("decode_task id=%llu n=%zu local=%d seed=%llu max=%d logprobs=%d temp=%.2f top_k=%d "
        "stop_ids=%zu tenant=%.*s",
        (unsigned long long)d->request_id, d->n_tokens, d->local_prefill,
        (unsigned long long)(sp ? sp->seed : 0), sp ? sp->max_tokens : 0, sp ? sp->logprobs : -9,
        sp ? sp->temperature : -1.0, sp ? sp->top_k : -1, sp ? sp->n_stop_ids : 0,
        (int)d->tenant.len, d->tenant.data ? (const char *)d->tenant.data : "");
    if (o.die_on_task) {
        say("dying");
        _exit(0);
    }
    if (silent)
        return;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    if (o.error_code) {
        Tandem__Error e = TANDEM__ERROR__INIT;
        e.code = o.error_code;
        e.message = "scripted refusal";
        e.request_id = d->request_id;
        f.body_case = TANDEM__FRAME__BODY_ERROR;
        f.error = &e;
        send_frame(&f);
        return;
    }
    uint32_t blocks[4] = {7, 8, 9, 10};
    Tandem__DecodeAccept a = TANDEM__DECODE_ACCEPT__INIT;
    a.request_id = d->request_id;
    a.n_blocks = 4;
    a.blocks = blocks;
    a.worker_request_id = d->request_id + 1000000;
    f.body_case = TANDEM__FRAME__BODY_DECODE_ACCEPT;
    f.decode_accept = &a;
    send_frame(&f);
    task_t *t = calloc(1, sizeof(*t));
    t->id = d->request_id;
    t->max_tokens = sp && sp->max_tokens > 0 ? sp->max_tokens : 1 << 30;
    t->logprobs = sp ? sp->logprobs : -1;
    t->prompt = (uint32_t)d->n_tokens;
    t->next = tasks;
    tasks = t;
    uv_timer_init(loop, &t->timer);
    t->timer.data = t;
    uv_timer_start(&t->timer, task_tick, 10, (uint64_t)o.interval_ms);
}

static void on_cancel(uint64_t id)
{
    say("cancel id=%llu", (unsigned long long)id);
    for (task_t *t = tasks; t; t = t->next)
        if (t->id == id) {
            task_end(t);
            return;
        }
    for (size_t i = 0; i < 1024; i++) /* a prefill not done yet: drop it */
        if (pjobs[i] && pjobs[i]->id == id) {
            uv_timer_stop(&pjobs[i]->timer);
            uv_close((uv_handle_t *)&pjobs[i]->timer, task_closed);
            pjobs[i] = NULL;
            return;
        }
}

/* ---- prefill ------------------------------------------------------------------------------ */

static void pjob_fire(uv_timer_t *tm)
{
    pjob_t *p = tm->data;
    for (size_t i = 0; i < 1024; i++)
        if (pjobs[i] == p)
            pjobs[i] = NULL;
    Tandem__PrefillDone d = TANDEM__PREFILL_DONE__INIT;
    d.request_id = p->id;
    d.status = o.prefill_status;
    d.message = o.prefill_status ? "scripted prefill failure" : "";
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_PREFILL_DONE;
    f.prefill_done = &d;
    send_frame(&f);
    say("prefill_done id=%llu status=%d", (unsigned long long)p->id, o.prefill_status);
    uv_close((uv_handle_t *)tm, task_closed);
}

static void on_prefill_task(const Tandem__PrefillTask *p)
{
    say("prefill_task id=%llu n=%zu decode=%s blob=%zu blocks=%zu dreq=%llu",
        (unsigned long long)p->request_id, p->n_tokens, p->decode_worker ? p->decode_worker : "",
        p->decode_blob.len, p->n_dst_blocks, (unsigned long long)p->decode_request_id);
    pjob_t *j = calloc(1, sizeof(*j));
    j->id = p->request_id;
    uv_timer_init(loop, &j->timer);
    j->timer.data = j;
    uv_timer_start(&j->timer, pjob_fire, (uint64_t)o.prefill_delay_ms, 0);
    for (size_t i = 0; i < 1024; i++)
        if (!pjobs[i]) {
            pjobs[i] = j;
            break;
        }
}

/* ---- worker connection --------------------------------------------------------------------- */

static void hb_tick(uv_timer_t *t)
{
    if (silent)
        return;
    Tandem__Load l = TANDEM__LOAD__INIT;
    l.total_blocks = (uint32_t)o.total_blocks;
    l.free_blocks = (uint32_t)o.total_blocks;
    l.draining = draining;
    Tandem__Heartbeat hb = TANDEM__HEARTBEAT__INIT;
    hb.seq = ++hb_seq;
    hb.load = &l;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HEARTBEAT;
    f.heartbeat = &hb;
    send_frame(&f);
}

static void w_ready(td_rpc_conn_t *c, void *ud)
{
    Tandem__KvLayout lay = TANDEM__KV_LAYOUT__INIT;
    lay.fingerprint.data = (uint8_t *)o.fp;
    lay.fingerprint.len = strlen(o.fp);
    lay.block_tokens = (uint32_t)o.block_tokens;
    lay.block_bytes = 4096;
    Tandem__Hello h = TANDEM__HELLO__INIT;
    h.role =
        strcmp(o.role, "prefill") == 0 ? TANDEM__ROLE__ROLE_PREFILL : TANDEM__ROLE__ROLE_DECODE;
    h.worker_id = (char *)o.id;
    h.model = (char *)o.model;
    h.layout = &lay;
    h.ucx_address.data = (uint8_t *)"blob-of-";
    h.ucx_address.len = 8;
    h.total_blocks = (uint32_t)o.total_blocks;
    h.max_running = 64;
    Tandem__Frame f = TANDEM__FRAME__INIT;
    f.body_case = TANDEM__FRAME__BODY_HELLO;
    f.hello = &h;
    td_rpc_send(c, &f);
    uv_timer_start(&hb_timer, hb_tick, (uint64_t)o.hb_ms, (uint64_t)o.hb_ms);
    say("ready");
}

static void w_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    switch (f->body_case) {
    case TANDEM__FRAME__BODY_DECODE_TASK:
        on_decode_task(f->decode_task);
        break;
    case TANDEM__FRAME__BODY_PREFILL_TASK:
        on_prefill_task(f->prefill_task);
        break;
    case TANDEM__FRAME__BODY_CANCEL:
        on_cancel(f->cancel->request_id);
        break;
    case TANDEM__FRAME__BODY_DRAIN:
        draining = f->drain->on;
        say("drain on=%d", f->drain->on);
        break;
    case TANDEM__FRAME__BODY_ERROR:
        say("error code=%d msg=%s", f->error->code, f->error->message ? f->error->message : "");
        break;
    default:
        say("frame %d", (int)f->body_case);
        break;
    }
}

static void w_close(td_rpc_conn_t *c, int status, void *ud)
{
    say("closed status=%d reason=%s", status, td_rpc_conn_reason(c));
    exit(0);
}

/* ---- client -------------------------------------------------------------------------------- */

static void print_text(const char *label, const uint8_t *p, size_t n)
{
    printf("%s=", label);
    for (size_t i = 0; i < n; i++) {
        if (p[i] == '\\')
            printf("\\\\");
        else if (p[i] == '\n')
            printf("\\n");
        else if (p[i] < 0x20)
            printf("\\x%02x", p[i]);
        else
            putchar(p[i]);
    }
}

static void exit_now(uv_timer_t *t)
{
    exit(0);
}

static void c_ready(td_rpc_conn_t *c, void *ud)
{
    Tandem__Frame f = TANDEM__FRAME__INIT;
    if (o.generate) {
        Tandem__Sampling sp = TANDEM__SAMPLING__INIT;
        sp.max_tokens = o.max_tokens;
        sp.logprobs = o.gen_logprobs;
        Tandem__GenerateRequest g = TANDEM__GENERATE_REQUEST__INIT;
        char *stops[1] = {(char *)o.stop};
        g.request_id = 77;
        if (o.messages)
            g.messages_json = (char *)o.messages;
        else
            g.prompt = (char *)o.generate;
        g.sampling = &sp;
        g.want_text = o.want_text;
        if (o.stop) {
            g.n_stop = 1;
            g.stop = stops;
        }
        f.body_case = TANDEM__FRAME__BODY_GENERATE;
        f.generate = &g;
        td_rpc_send(c, &f);
    } else if (o.tokenize) {
        Tandem__TokenizeRequest q = TANDEM__TOKENIZE_REQUEST__INIT;
        q.request_id = 5;
        q.text = (char *)o.tokenize;
        q.add_special_tokens = true;
        f.body_case = TANDEM__FRAME__BODY_TOKENIZE;
        f.tokenize = &q;
        td_rpc_send(c, &f);
    } else {
        Tandem__StatusRequest q = TANDEM__STATUS_REQUEST__INIT;
        q.request_id = 9;
        q.drain_worker = (char *)o.drain;
        q.undrain = o.undrain;
        f.body_case = TANDEM__FRAME__BODY_STATUS;
        f.status = &q;
        td_rpc_send(c, &f);
    }
    say("ready");
}

static void c_frame(td_rpc_conn_t *c, const Tandem__Frame *f, void *ud)
{
    if (f->body_case == TANDEM__FRAME__BODY_TOKEN_CHUNK) {
        const Tandem__TokenChunk *k = f->token_chunk;
        printf("chunk id=%llu tokens=", (unsigned long long)k->request_id);
        for (size_t i = 0; i < k->n_tokens; i++)
            printf("%s%d", i ? "," : "", k->tokens[i]);
        printf(" logprobs=%zu finish=%d prompt=%u completion=%u ", k->n_logprobs, (int)k->finish,
               k->prompt_tokens, k->completion_tokens);
        print_text("text", k->text.data, k->text.len);
        putchar('\n');
        fflush(stdout);
        chunks_seen++;
        if (o.cancel_after && chunks_seen == o.cancel_after) {
            Tandem__Cancel cc = TANDEM__CANCEL__INIT;
            cc.request_id = k->request_id;
            Tandem__Frame out = TANDEM__FRAME__INIT;
            out.body_case = TANDEM__FRAME__BODY_CANCEL;
            out.cancel = &cc;
            td_rpc_send(c, &out);
            say("canceled");
            /* nothing more comes for a canceled request: leave shortly */
            uv_timer_start(&hb_timer, exit_now, 300, 0);
        }
        if (k->finish != TANDEM__FINISH__FINISH_NONE)
            exit(0);
    } else if (f->body_case == TANDEM__FRAME__BODY_ERROR) {
        say("error id=%llu code=%d msg=%s", (unsigned long long)f->error->request_id,
            f->error->code, f->error->message ? f->error->message : "");
        exit(2);
    } else if (f->body_case == TANDEM__FRAME__BODY_TOKENIZE_RESPONSE) {
        const Tandem__TokenizeResponse *r = f->tokenize_response;
        printf("ids=");
        for (size_t i = 0; i < r->n_ids; i++)
            printf("%s%d", i ? "," : "", r->ids[i]);
        putchar('\n');
        exit(0);
    } else if (f->body_case == TANDEM__FRAME__BODY_STATUS_RESPONSE) {
        const Tandem__StatusResponse *r = f->status_response;
        say("status router=%s model=%s running=%u waiting=%u workers=%zu", r->router_id, r->model,
            r->running, r->waiting, r->n_workers);
        for (size_t i = 0; i < r->n_workers; i++) {
            const Tandem__WorkerStatus *w = r->workers[i];
            say("worker id=%s role=%d alive=%d assigned=%llu draining=%d age=%.3f", w->worker_id,
                (int)w->role, w->alive, (unsigned long long)w->assigned,
                w->load ? w->load->draining : -1, w->last_heartbeat_age);
        }
        exit(0);
    }
}

static void c_close(td_rpc_conn_t *c, int status, void *ud)
{
    say("closed status=%d reason=%s", status, td_rpc_conn_reason(c));
    exit(3);
}

static void usage(void)
{
    fprintf(stderr,
            "usage: fake_worker --role decode|prefill|client --addr A --secret S [--id ID]\n"
            "  worker: --tokens 1,2,3 --chunk N --interval-ms N --hb-ms N --fp TEXT\n"
            "          --block-tokens N --total-blocks N --error-code C --die-after N\n"
            "          --die-on-task --hang-after N --prefill-status S --prefill-delay-ms N\n"
            "  client: --generate TEXT [--messages JSON --max N --stop S --text --logprobs K "
            "--cancel-after N]\n"
            "          | --tokenize TEXT | --status [--drain ID --undrain]\n");
    exit(64);
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define ARG(name) (strcmp(a, name) == 0 && v && (i++, true))
        if (ARG("--role"))
            o.role = v;
        else if (ARG("--addr"))
            o.addr = v;
        else if (ARG("--secret"))
            o.secret = v;
        else if (ARG("--id"))
            o.id = v;
        else if (ARG("--tokens")) {
            char *dup = strdup(v), *save = NULL;
            for (char *t = strtok_r(dup, ",", &save); t && o.n_tokens < 256;
                 t = strtok_r(NULL, ",", &save))
                o.tokens[o.n_tokens++] = atoi(t);
            free(dup);
        } else if (ARG("--chunk"))
            o.chunk = atoi(v);
        else if (ARG("--interval-ms"))
            o.interval_ms = atoi(v);
        else if (ARG("--hb-ms"))
            o.hb_ms = atoi(v);
        else if (ARG("--fp"))
            o.fp = v;
        else if (ARG("--model"))
            o.model = v;
        else if (ARG("--block-tokens"))
            o.block_tokens = atoi(v);
        else if (ARG("--total-blocks"))
            o.total_blocks = atoi(v);
        else if (ARG("--error-code"))
            o.error_code = atoi(v);
        else if (ARG("--die-after"))
            o.die_after = atoi(v);
        else if (ARG("--hang-after"))
            o.hang_after = atoi(v);
        else if (ARG("--prefill-status"))
            o.prefill_status = atoi(v);
        else if (ARG("--prefill-delay-ms"))
            o.prefill_delay_ms = atoi(v);
        else if (ARG("--generate"))
            o.generate = v;
        else if (ARG("--messages"))
            o.messages = v;
        else if (ARG("--tokenize"))
            o.tokenize = v;
        else if (ARG("--stop"))
            o.stop = v;
        else if (ARG("--drain"))
            o.drain = v;
        else if (ARG("--max"))
            o.max_tokens = atoi(v);
        else if (ARG("--logprobs"))
            o.gen_logprobs = atoi(v);
        else if (ARG("--cancel-after"))
            o.cancel_after = atoi(v);
        else if (strcmp(a, "--die-on-task") == 0)
            o.die_on_task = true;
        else if (strcmp(a, "--status") == 0)
            o.status = true;
        else if (strcmp(a, "--undrain") == 0)
            o.undrain = true;
        else if (strcmp(a, "--text") == 0)
            o.want_text = true;
        else
            usage();
#undef ARG
    }
    if (!o.role || !o.addr || !o.secret)
        usage();
    if (!o.n_tokens)
        for (int i = 0; i < 8; i++)
            o.tokens[o.n_tokens++] = 1000 + i;
    if (o.chunk < 1)
        o.chunk = 1;
    bool is_client = strcmp(o.role, "client") == 0;
    if (!o.id)
        o.id = is_client ? "client" : o.role;
    td_log_init("fake_worker", TD_LOG_WARN, TD_LOG_LOGFMT, 2);
    loop = uv_default_loop();
    uv_timer_init(loop, &hb_timer);
    td_rpc_opts_t ro = {0};
    ro.secret = (const uint8_t *)o.secret;
    ro.secret_len = strlen(o.secret);
    ro.id = o.id;
    ro.cb.on_ready = is_client ? c_ready : w_ready;
    ro.cb.on_frame = is_client ? c_frame : w_frame;
    ro.cb.on_close = is_client ? c_close : w_close;
    if (td_rpc_client_start(loop, o.addr, &ro, false, &client) != 0) {
        fprintf(stderr, "fake_worker: %s\n", td_err_msg());
        return 1;
    }
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}
