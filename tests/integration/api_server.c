/* api_server.c: a test server that speaks tandem's OpenAI and Anthropic HTTP API with a scripted
 * "model" (it always answers the same tokens), so that official client libraries can be run
 * against the router's request parsing (router/api.c), response framing (router/response.c) and
 * HTTP layer (common/net/http.c) without an engine. Prints "port N" on stdout once listening; exits
 * on SIGTERM. Test scaffolding, not a server to deploy. */
#include "api.h"
#include "response.h"
#include "td_daemon.h"
#include "td_error.h"
#include "td_http.h"
#include "td_log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const TOKENS[] = {"Hello", ",", " w\xc3\xb6rld", "!"};
enum { N_TOKENS = 4, PROMPT_TOKENS = 7 };

static uv_loop_t *loop;
static td_http_server_t *server;

/* One streamed response in flight: a timer emits a token every 2 ms for every choice. */
typedef struct stream {
    uv_timer_t timer;
    td_http_stream_t *st;
    td_api_request_t req;
    td_resp_ctx_t ctx;
    bool role_sent[TD_API_MAX_N];
    int step;
    int n_out; /* tokens per choice: min(max_tokens, N_TOKENS) */
    bool canceled;
} stream_t;

static void stream_closed(uv_handle_t *h)
{
    stream_t *s = h->data;
    td_api_request_free(&s->req);
    free(s);
}

static void fake_logprob(int i, size_t offset, td_resp_top_t top[2], td_resp_logprob_t *lp)
{
    top[0] = (td_resp_top_t){TOKENS[i], strlen(TOKENS[i]), -0.25};
    top[1] = (td_resp_top_t){"?", 1, -2.5};
    *lp = (td_resp_logprob_t){TOKENS[i], strlen(TOKENS[i]), offset, -0.25, top, 2};
}

static void tick(uv_timer_t *t)
{
    stream_t *s = t->data;
    td_buf_t out;
    td_buf_init(&out);
    td_resp_usage_t usage = {PROMPT_TOKENS, (int64_t)s->n_out * s->req.n, 0};
    if (s->step < s->n_out) {
        size_t off = 0;
        for (int k = 0; k < s->step; k++)
            off += strlen(TOKENS[k]);
        for (int c = 0; c < s->req.n; c++) {
            td_resp_top_t top[2];
            td_resp_logprob_t lp;
            fake_logprob(s->step, off, top, &lp);
            td_resp_delta(&out, &s->ctx, c, TOKENS[s->step], strlen(TOKENS[s->step]),
                          s->req.logprobs ? &lp : NULL);
        }
        s->step++;
    } else {
        td_resp_finish_t why = s->n_out < N_TOKENS ? TD_RESP_LENGTH : TD_RESP_STOP;
        usage.completion_tokens = s->n_out; /* per choice for Anthropic (n is 1 there) */
        for (int c = 0; c < s->req.n; c++)
            td_resp_finish(&out, &s->ctx, c, why, &usage);
        usage.completion_tokens = (int64_t)s->n_out * s->req.n;
        td_resp_done(&out, &s->ctx, &usage);
        s->step = -1;
    }
    if (!s->canceled && out.len)
        td_http_stream_write(s->st, out.data, out.len);
    td_buf_free(&out);
    if (s->step < 0 || s->canceled) {
        td_http_stream_end(s->st);
        uv_timer_stop(t);
        uv_close((uv_handle_t *)t, stream_closed);
    }
}

static void on_cancel(td_http_stream_t *st, void *ud)
{
    ((stream_t *)ud)->canceled = true;
}

static void handle(td_http_req_t *r, td_api_kind_t kind)
{
    if (!td_http_method_is(r, "POST")) {
        td_http_respond_error(r, 405, "invalid_request_error", NULL, NULL, "use POST");
        return;
    }
    size_t len;
    const char *body = td_http_body(r, &len);
    stream_t *s = calloc(1, sizeof(*s));
    const char *param;
    int rc = td_api_parse(kind, body, len, &s->req, &param);
    if (rc) {
        static const char anthropic_error[] =
            "{\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\","
            "\"message\":\"invalid request\"}}";
        if (kind == TD_API_MESSAGES)
            td_http_respond(r, 400, "application/json", anthropic_error,
                            sizeof(anthropic_error) - 1);
        else
            td_http_respond_error(r, 400, "invalid_request_error", param, NULL, "%s",
                                  td_err_msg());
        free(s);
        return;
    }
    s->n_out = (int)(s->req.max_tokens > 0 && s->req.max_tokens < N_TOKENS ? s->req.max_tokens
                                                                             : N_TOKENS);
    s->ctx.kind = kind;
    s->ctx.id = kind == TD_API_CHAT ? "chatcmpl-test" : kind == TD_API_MESSAGES ? "msg_test" : "cmpl-test";
    s->ctx.model = s->req.model ? s->req.model : "tiny";
    s->ctx.created = 1700000000;
    s->ctx.include_usage = s->req.include_usage;
    s->ctx.logprobs = s->req.logprobs;
    s->ctx.prompt_tokens = PROMPT_TOKENS;
    s->ctx.role_sent = s->role_sent;
    if (!s->req.stream) {
        td_resp_choice_t ch[TD_API_MAX_N];
        td_resp_logprob_t lps[N_TOKENS];
        td_resp_top_t tops[N_TOKENS][2];
        char text[64] = "";
        size_t off = 0;
        for (int i = 0; i < s->n_out; i++) {
            fake_logprob(i, off, tops[i], &lps[i]);
            off += strlen(TOKENS[i]);
            strcat(text, TOKENS[i]);
        }
        for (int c = 0; c < s->req.n; c++)
            ch[c] = (td_resp_choice_t){text, strlen(text),
                                       s->n_out < N_TOKENS ? TD_RESP_LENGTH : TD_RESP_STOP, lps,
                                       (size_t)s->n_out};
        td_resp_usage_t usage = {PROMPT_TOKENS, (int64_t)s->n_out * s->req.n, 0};
        td_buf_t out;
        td_buf_init(&out);
        td_resp_full(&out, &s->ctx, ch, (size_t)s->req.n, &usage);
        td_http_respond(r, 200, "application/json", out.data, out.len);
        td_buf_free(&out);
        td_api_request_free(&s->req);
        free(s);
        return;
    }
    s->st = td_http_stream_start(r, 200, "text/event-stream", on_cancel, s);
    uv_timer_init(loop, &s->timer);
    s->timer.data = s;
    uv_timer_start(&s->timer, tick, 2, 2);
}

static void h_chat(td_http_req_t *r, void *ud)
{
    handle(r, TD_API_CHAT);
}

static void h_completions(td_http_req_t *r, void *ud)
{
    handle(r, TD_API_COMPLETIONS);
}

static void h_messages(td_http_req_t *r, void *ud)
{
    handle(r, TD_API_MESSAGES);
}

static void on_stop(td_daemon_t *d, int signum, void *ud)
{
    td_http_server_close(server);
    td_daemon_close(d);
}

int main(void)
{
    loop = uv_default_loop();
    td_log_init("api_server", TD_LOG_WARN, TD_LOG_LOGFMT, 2);
    td_daemon_t *d = td_daemon_start(loop, on_stop, NULL);
    server = td_http_server_new(loop, NULL);
    td_http_route(server, "/v1/chat/completions", h_chat, NULL);
    td_http_route(server, "/v1/completions", h_completions, NULL);
    td_http_route(server, "/v1/messages", h_messages, NULL);
    if (!d || td_http_listen(server, "127.0.0.1:0") != 0) {
        fprintf(stderr, "api_server: %s\n", td_err_msg());
        return 1;
    }
    printf("port %d\n", td_http_port(server));
    fflush(stdout);
    uv_run(loop, UV_RUN_DEFAULT);
    return 0;
}
