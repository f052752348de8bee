/* http_api.c: the router's HTTP API: OpenAI completions and chat completions, Anthropic messages
 * (whole and streamed, with tool calls), and the route table (the other endpoints: http_misc.c).
 * Requests become jobs (reqs_job.c); this file turns the job's events into response bytes with
 * response.c. */
#include "router.h"

#include "auth.h"
#include "toolparse.h"
#include "http_impl.h"
#include "td_error.h"
#include "td_frame.h"
#include "td_log.h"
#include "td_util.h"

#include <inttypes.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One logprob record of a generated token, strings in the choice's arena. */
typedef struct hlp {
    size_t tok_off, tok_len; /* token text in arena */
    size_t raw_off, raw_len; /* its raw bytes in arena (may end inside a UTF-8 character) */
    size_t text_offset;      /* bytes of choice text before the token */
    double logprob;
    size_t top_start, n_top; /* [top_start, top_start + n_top) in tops */
} hlp_t;

typedef struct htop {
    size_t off, len;         /* alternative's text in arena */
    size_t raw_off, raw_len; /* its raw bytes in arena */
    double logprob;
} htop_t;

/* What one choice keeps for the final (non-streaming) response. */
typedef struct hchoice {
    td_buf_t arena; /* token texts of lp and tops */
    hlp_t *lp;      /* [n_lp] per generated token (logprobs asked) */
    size_t n_lp, cap_lp;
    htop_t *tops; /* [n_tops] */
    size_t n_tops, cap_tops;
    size_t text_len; /* bytes of text released so far */
    td_resp_finish_t finish;
    const char *stop; /* the stop string that ended it (owned by the job) */
    td_tool_stream_t ts; /* streaming with tools: text held back while a call may follow */
} hchoice_t;

typedef struct hjob {
    td_router_t *rt;
    td_http_req_t *req;   /* non-streaming: answered when the job ends */
    td_http_stream_t *st; /* streaming */
    td_api_request_t api;
    td_resp_ctx_t ctx;
    bool role_sent[TD_API_MAX_N * 16];
    char id[64];
    td_job_t *job;
    hchoice_t *ch; /* [n_seqs] */
    size_t n_seqs;
    char **echo; /* [n_prompts] prompt text for echo, or NULL */
    size_t *echo_len;
    td_buf_t out;  /* stream bytes to write on the next flush */
    td_buf_t head; /* the stream's chunk opening, formatted once (td_resp_ctx_t.head) */
    bool canceled;
    td_http_grant_t grant; /* what a keyed request's admission charged (http_access.c) */
    td_tool_fmt_t tool_fmt; /* TD_TOOL_FMT_NONE: outputs are not parsed for calls */
    char *prefill;          /* a forced call's opening, prefilled after the prompt, or NULL */
    td_resp_blocks_t blocks;
    td_resp_rstate_t rs; /* Responses API stream state */
    char msg_id[64];     /* Responses: the message item's id */
} hjob_t;

#define MAX_SEQS (TD_API_MAX_N * 16)

bool td__http_method_is(td_http_req_t *r, const char *m, td_api_kind_t kind)
{
    if (td_http_method_is(r, m))
        return true;
    td_http_add_header(r, "Allow", m);
    char msg[64];
    snprintf(msg, sizeof(msg), "Method not allowed: use %s", m);
    td__http_error(r, kind, 405, NULL, NULL, msg);
    return false;
}

/* ---- job events ---------------------------------------------------------------------------- */

static void usage_of(const hjob_t *h, td_resp_usage_t *u);

static void hjob_free(hjob_t *h)
{
    if (h->grant.use) {
        td_resp_usage_t u = {0};
        if (h->job)
            usage_of(h, &u);
        td__http_grant_end(h->rt, &h->grant,
                           (uint64_t)u.prompt_tokens + (uint64_t)u.completion_tokens);
    }
    for (size_t i = 0; i < h->n_seqs; i++) {
        td_buf_free(&h->ch[i].arena);
        free(h->ch[i].lp);
        free(h->ch[i].tops);
        td_tool_stream_free(&h->ch[i].ts);
    }
    free(h->prefill);
    td_resp_rstate_free(&h->rs);
    free(h->ch);
    if (h->echo)
        for (size_t i = 0; i < h->api.n_prompts; i++)
            free(h->echo[i]);
    free(h->echo);
    free(h->echo_len);
    td_buf_free(&h->out);
    td_buf_free(&h->head);
    td_api_request_free(&h->api);
    td_job_free(h->job);
    free(h);
}

/* Record one token's logprobs in the choice; fill *out (pointers into `tmp`) for streaming. */
static int record_lp(hjob_t *h, hchoice_t *c, int32_t id, const Tandem__TokenLogprob *lp)
{
    if (c->n_lp == c->cap_lp) {
        size_t cap = c->cap_lp ? c->cap_lp * 2 : 16;
        hlp_t *t = td_reallocarray(c->lp, cap, sizeof(*t));
        if (!t)
            return TD_ENOMEM;
        c->lp = t;
        c->cap_lp = cap;
    }
    hlp_t *r = &c->lp[c->n_lp];
    r->tok_off = c->arena.len;
    int rc = td_router_token_text(h->rt, id, &c->arena);
    if (rc)
        return rc;
    r->tok_len = c->arena.len - r->tok_off;
    r->raw_off = c->arena.len;
    if ((rc = td_tokenizer_token_bytes(h->rt->tok, id, &c->arena)) != 0)
        return rc;
    r->raw_len = c->arena.len - r->raw_off;
    r->text_offset = c->text_len;
    r->logprob = lp->logprob;
    r->top_start = c->n_tops;
    r->n_top = 0;
    size_t n = TD_MIN(lp->n_top_ids, lp->n_top_logprobs);
    n = TD_MIN(n, (size_t)TD_API_MAX_LOGPROBS);
    for (size_t i = 0; i < n; i++) {
        if (c->n_tops == c->cap_tops) {
            size_t cap = c->cap_tops ? c->cap_tops * 2 : 32;
            htop_t *t = td_reallocarray(c->tops, cap, sizeof(*t));
            if (!t)
                return TD_ENOMEM;
            c->tops = t;
            c->cap_tops = cap;
        }
        htop_t *tp = &c->tops[c->n_tops++];
        tp->off = c->arena.len;
        if (td_router_token_text(h->rt, lp->top_ids[i], &c->arena) != 0)
            td_buf_append_str(&c->arena, "");
        tp->len = c->arena.len - tp->off;
        tp->raw_off = c->arena.len;
        if (td_tokenizer_token_bytes(h->rt->tok, lp->top_ids[i], &c->arena) != 0)
            td_buf_append_str(&c->arena, "");
        tp->raw_len = c->arena.len - tp->raw_off;
        tp->logprob = lp->top_logprobs[i];
        r->n_top++;
    }
    c->n_lp++;
    return 0;
}

/* Build td_resp_logprob_t views of records [from, to) (arrays caller-freed). */
static td_resp_logprob_t *lp_views(const hchoice_t *c, size_t from, size_t to, td_resp_top_t **tops)
{
    size_t n = to - from;
    td_resp_logprob_t *v = td_calloc(n ? n : 1, sizeof(*v));
    size_t nt = 0;
    for (size_t i = from; i < to; i++)
        nt += c->lp[i].n_top;
    td_resp_top_t *t = td_calloc(nt ? nt : 1, sizeof(*t));
    if (!v || !t) {
        free(v);
        free(t);
        *tops = NULL;
        return NULL;
    }
    size_t k = 0;
    for (size_t i = from; i < to; i++) {
        const hlp_t *r = &c->lp[i];
        v[i - from] = (td_resp_logprob_t){c->arena.data + r->tok_off,
                                          r->tok_len,
                                          r->text_offset,
                                          r->logprob,
                                          &t[k],
                                          r->n_top,
                                          c->arena.data + r->raw_off,
                                          r->raw_len};
        for (size_t q = 0; q < r->n_top; q++) {
            const htop_t *tp = &c->tops[r->top_start + q];
            t[k++] = (td_resp_top_t){c->arena.data + tp->off, tp->len, tp->logprob,
                                     c->arena.data + tp->raw_off, tp->raw_len};
        }
    }
    *tops = t;
    return v;
}

static void write_out(hjob_t *h);
static void on_stream_cancel(td_http_stream_t *st, void *ud);

/* A streaming request's response starts at its first event (the echoed prompt first). Returns
 * whether there is a stream to write to (false for a whole answer, or when the start failed:
 * then the job is aborted and answered with an error). */
static bool stream_open(hjob_t *h)
{
    if (h->st || !h->api.stream || h->canceled)
        return h->st != NULL;
    h->st = td_http_stream_start(h->req, 200, "text/event-stream", on_stream_cancel, h);
    if (!h->st) {
        h->canceled = true;
        td_job_abort(h->job, 500, "out of memory");
        return false;
    }
    size_t n = (size_t)(h->api.n > 0 ? h->api.n : 1);
    for (size_t i = 0; h->echo && i < h->n_seqs; i++)
        td_resp_delta(&h->out, &h->ctx, (int)i, h->echo[i / n], h->echo_len[i / n], NULL);
    return true;
}

static void ev_token(td_job_t *j, int idx, int32_t id, const Tandem__TokenLogprob *lp,
                     const char *text, size_t len)
{
    hjob_t *h = j->ud;
    hchoice_t *c = &h->ch[idx];
    bool with_lp = id >= 0 && lp && h->api.logprobs;
    if (with_lp && record_lp(h, c, id, lp) != 0)
        with_lp = false;
    c->text_len += len;
    if (!stream_open(h) || h->canceled)
        return;
    if (h->tool_fmt != TD_TOOL_FMT_NONE) { /* held text goes out without logprobs */
        td_buf_t rel;
        td_buf_init(&rel);
        if (td_tool_stream_feed(&c->ts, text, len, &rel) == 0 && rel.len)
            td_resp_delta(&h->out, &h->ctx, idx, rel.data, rel.len, NULL);
        td_buf_free(&rel);
        return;
    }
    if (with_lp) {
        td_resp_top_t *tops;
        td_resp_logprob_t *v = lp_views(c, c->n_lp - 1, c->n_lp, &tops);
        td_resp_delta(&h->out, &h->ctx, idx, text, len, v);
        free(v);
        free(tops);
    } else {
        td_resp_delta(&h->out, &h->ctx, idx, text, len, NULL);
    }
}

/* A client that stops reading while its stream keeps coming is dropped past this many bytes
 * queued, so one slow reader cannot make the router buffer without bound. */
#define STREAM_PENDING_MAX (32u << 20)

static void write_out(hjob_t *h)
{
    if (h->st && h->out.len && !h->canceled) {
        td_http_stream_write_buf(h->st, &h->out);
        if (td_http_stream_pending(h->st) > STREAM_PENDING_MAX && !h->job->ended) {
            h->canceled = true;
            td_job_abort(h->job, 499, "the client does not read its stream");
        }
    }
    td_buf_reset(&h->out);
}

static void ev_flush(td_job_t *j, int idx)
{
    write_out(j->ud);
}

static void usage_of(const hjob_t *h, td_resp_usage_t *u)
{
    const td_job_t *j = h->job;
    size_t n = (size_t)(h->api.n > 0 ? h->api.n : 1);
    memset(u, 0, sizeof(*u));
    for (size_t i = 0; i < j->n_seqs; i++) {
        const td_seq_t *s = &j->seqs[i];
        if (i % n == 0) {
            u->prompt_tokens += s->prompt_tokens;
            u->cached_tokens += s->cached_tokens;
        }
        u->completion_tokens += s->completion_tokens ? s->completion_tokens : s->n_tokens;
    }
}

static void random_id(char *out, size_t n, const char *prefix);

/* Views of parsed calls with fresh ids; Anthropic's input must be a JSON object, so arguments
 * that are not one become {} there (docs/api.md). `ids` holds [n][40]. */
static void tool_views(const hjob_t *h, const td_tool_parsed_t *p, td_resp_tool_t *v,
                       char (*ids)[40])
{
    for (size_t k = 0; k < p->n_calls; k++) {
        random_id(ids[k], sizeof(ids[k]), h->api.kind == TD_API_MESSAGES ? "toolu_" : "call_");
        const char *args = p->calls[k].arguments;
        if (h->api.kind == TD_API_MESSAGES) {
            json_object *o = json_tokener_parse(args);
            if (!o || !json_object_is_type(o, json_type_object))
                args = "{}";
            json_object_put(o);
        }
        v[k] = (td_resp_tool_t){ids[k], p->calls[k].name, args};
    }
}

/* Streaming with tools: send what the choice held back (text, then its calls); the finish
 * reason becomes TD_RESP_TOOLS when there were calls. */
static td_resp_finish_t flush_tools(hjob_t *h, int idx, td_resp_finish_t why)
{
    td_tool_parsed_t p;
    if (td_tool_stream_end(&h->ch[idx].ts, &p) != 0)
        return why;
    if (p.text_len)
        td_resp_delta(&h->out, &h->ctx, idx, p.text, p.text_len, NULL);
    td_resp_tool_t *v = p.n_calls ? td_calloc(p.n_calls, sizeof(*v)) : NULL;
    char(*ids)[40] = p.n_calls ? td_calloc(p.n_calls, sizeof(*ids)) : NULL;
    if (v && ids) {
        tool_views(h, &p, v, ids);
        for (size_t k = 0; k < p.n_calls; k++)
            td_resp_tool_call(&h->out, &h->ctx, idx, (int)k, &v[k]);
        if (why != TD_RESP_ABORT)
            why = TD_RESP_TOOLS;
    }
    free(v);
    free(ids);
    td_tool_parsed_free(&p);
    return why;
}

static void ev_finish(td_job_t *j, int idx, td_resp_finish_t why, const char *stop)
{
    hjob_t *h = j->ud;
    hchoice_t *c = &h->ch[idx];
    c->finish = why;
    c->stop = stop;
    if (!stream_open(h) || h->canceled)
        return;
    const td_seq_t *s = &j->seqs[idx];
    td_resp_usage_t u = {s->prompt_tokens,
                         s->completion_tokens ? s->completion_tokens : s->n_tokens,
                         s->cached_tokens};
    h->ctx.stop_sequence = stop;
    if (h->tool_fmt != TD_TOOL_FMT_NONE)
        why = flush_tools(h, idx, why);
    td_resp_finish(&h->out, &h->ctx, idx, why, &u);
    write_out(h);
}

static void ev_done(td_job_t *j)
{
    hjob_t *h = j->ud;
    td_resp_usage_t u;
    usage_of(h, &u);
    if (h->api.stream) {
        if (stream_open(h)) {
            if (!h->canceled) {
                td_resp_done(&h->out, &h->ctx, &u);
                write_out(h);
            }
            td_http_stream_end(h->st);
        } else if (!h->st) {
            td__http_error(h->req, h->api.kind, 500, NULL, NULL, "out of memory");
        }
        hjob_free(h);
        return;
    }
    td_resp_choice_t ch[MAX_SEQS];
    td_resp_logprob_t *views[MAX_SEQS] = {0};
    td_resp_top_t *tops[MAX_SEQS] = {0};
    td_buf_t texts[MAX_SEQS];
    td_tool_parsed_t parsed[MAX_SEQS];
    td_resp_tool_t *tv[MAX_SEQS] = {0};
    char(*tids[MAX_SEQS])[40] = {0};
    size_t n = (size_t)(h->api.n > 0 ? h->api.n : 1);
    for (size_t i = 0; i < j->n_seqs; i++) {
        const td_seq_t *s = &j->seqs[i];
        td_buf_init(&texts[i]);
        if (h->echo) {
            size_t p = i / n;
            td_buf_append(&texts[i], h->echo[p], h->echo_len[p]);
        }
        td_buf_append(&texts[i], s->text.data ? s->text.data : "", s->text.len);
        if (h->api.logprobs && h->ch[i].n_lp) {
            views[i] = lp_views(&h->ch[i], 0, h->ch[i].n_lp, &tops[i]);
            if (views[i] && h->echo) /* offsets count the echoed prompt too */
                for (size_t k = 0; k < h->ch[i].n_lp; k++)
                    views[i][k].text_offset += h->echo_len[i / n];
        }
        ch[i] = (td_resp_choice_t){texts[i].data ? texts[i].data : "", texts[i].len,
                                   h->ch[i].finish, views[i], views[i] ? h->ch[i].n_lp : 0};
        memset(&parsed[i], 0, sizeof(parsed[i]));
        if (h->tool_fmt == TD_TOOL_FMT_NONE)
            continue;
        td_buf_t all;
        td_buf_init(&all);
        if (h->prefill)
            td_buf_append_str(&all, h->prefill);
        td_buf_append(&all, s->text.data ? s->text.data : "", s->text.len);
        if (td_tool_parse(h->tool_fmt, all.data ? all.data : "", all.len, &parsed[i]) == 0) {
            ch[i].text = parsed[i].text;
            ch[i].len = parsed[i].text_len;
            if (parsed[i].n_calls && (tv[i] = td_calloc(parsed[i].n_calls, sizeof(*tv[i]))) &&
                (tids[i] = td_calloc(parsed[i].n_calls, sizeof(*tids[i])))) {
                tool_views(h, &parsed[i], tv[i], tids[i]);
                ch[i].tools = tv[i];
                ch[i].n_tools = parsed[i].n_calls;
                if (ch[i].finish != TD_RESP_ABORT)
                    ch[i].finish = TD_RESP_TOOLS;
            }
        }
        td_buf_free(&all);
    }
    h->ctx.stop_sequence = h->ch[0].stop;
    td_buf_t out;
    td_buf_init(&out);
    int rc = td_resp_full(&out, &h->ctx, ch, j->n_seqs, &u);
    if (rc)
        td__http_error(h->req, h->api.kind, 500, NULL, NULL, "out of memory");
    else
        td_http_respond(h->req, 200, "application/json", out.data, out.len);
    td_buf_free(&out);
    for (size_t i = 0; i < j->n_seqs; i++) {
        td_buf_free(&texts[i]);
        free(views[i]);
        free(tops[i]);
        td_tool_parsed_free(&parsed[i]);
        free(tv[i]);
        free(tids[i]);
    }
    hjob_free(h);
}

static void ev_fail(td_job_t *j, int status, int code, const char *msg)
{
    hjob_t *h = j->ud;
    if (h->st) {
        if (!h->canceled) {
            td_resp_stream_error(
                &h->out, &h->ctx,
                h->api.kind == TD_API_MESSAGES ? td__anthropic_type(status) : td__openai_type(status), msg);
            write_out(h);
        }
        td_http_stream_end(h->st);
    } else {
        td__http_error(h->req, h->api.kind, status == 499 ? 500 : status, NULL, NULL, msg);
    }
    hjob_free(h);
}

static const td_job_ops_t http_ops = {ev_token, ev_flush, ev_finish, ev_done, ev_fail};

static void on_stream_cancel(td_http_stream_t *st, void *ud)
{
    hjob_t *h = ud;
    h->canceled = true;
    td_job_abort(h->job, 499, "the client disconnected");
}

/* A non-streaming client closed its connection before its answer: cancel on every worker. */
static void on_req_gone(void *ud)
{
    hjob_t *h = ud;
    td_job_abort(h->job, 499, "the client disconnected");
}

/* ---- generation endpoints ------------------------------------------------------------------ */

static void random_id(char *out, size_t n, const char *prefix)
{
    uint8_t b[12];
    char hex[25];
    if (td_random_id_bytes(b, sizeof(b)) != 0)
        memset(b, 0, sizeof(b));
    td_hex_encode(b, sizeof(b), hex);
    size_t pl = strlen(prefix);
    if (pl + sizeof(hex) <= n) {
        memcpy(out, prefix, pl);
        memcpy(out + pl, hex, sizeof(hex)); /* with its NUL */
    } else {
        snprintf(out, n, "%s%s", prefix, hex);
    }
}

/* Tokenize prompt p of a completions request. 0 or an error with td_err_msg (400). */
static int prompt_tokens(td_router_t *rt, const td_api_prompt_t *p, td_tokens_t *out)
{
    if (p->text)
        return td_tokenizer_encode(rt->tok, p->text, strlen(p->text), true, out);
    size_t vocab = td_tokenizer_vocab_size(rt->tok);
    for (size_t i = 0; i < p->n_ids; i++) {
        if (p->ids[i] < 0 || (size_t)p->ids[i] >= vocab)
            return td_err_set(TD_EINVAL,
                              "prompt token id %d at index %zu is outside the "
                              "vocabulary (0..%zu)",
                              p->ids[i], i, vocab - 1);
        int rc = td_tokens_push(out, p->ids[i]);
        if (rc)
            return rc;
    }
    return 0;
}

static void handle_generate(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind)
{
    td_apikey_t *key;
    if (!td__http_method_is(r, "POST", kind) || !td__http_authorized(rt, r, kind, &key))
        return;
    hjob_t *h = td_calloc(1, sizeof(*h));
    if (!h) {
        td__http_error(r, kind, 500, NULL, NULL, "out of memory");
        return;
    }
    h->rt = rt;
    td_buf_init(&h->out);
    td_buf_init(&h->head);
    size_t len;
    const char *body = td_http_body(r, &len);
    const char *param = NULL;
    char msg[1024];
    td_tokens_t toks[TD_API_MAX_N];
    size_t n_toks = 0;
    int status = 400;
    const char *code = NULL;
    int rc = td_api_parse(kind, body ? body : "", body ? len : 0, &h->api, &param);
    if (rc) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        goto fail;
    }
    if (h->api.model && strcmp(h->api.model, rt->model_name) != 0) {
        snprintf(msg, sizeof(msg), "The model `%.200s` does not exist.", h->api.model);
        status = 404;
        param = "model";
        code = "model_not_found";
        goto fail;
    }
    /* prompts */
    size_t n_prompts = kind == TD_API_COMPLETIONS ? h->api.n_prompts : 1;
    size_t n = (size_t)(h->api.n > 0 ? h->api.n : 1);
    if (n_prompts == 0 || n_prompts > TD_API_MAX_N || n_prompts * n > MAX_SEQS) {
        snprintf(msg, sizeof(msg),
                 "between 1 and %d prompts are accepted, with at most %d "
                 "choices in all",
                 TD_API_MAX_N, MAX_SEQS);
        param = "prompt";
        goto fail;
    }
    td_chat_opts_t copts = {
        .add_generation_prompt = kind == TD_API_MESSAGES || h->api.add_generation_prompt,
        .disable_thinking = h->api.disable_thinking,
        .tools = h->api.tools,
        .kwargs = h->api.template_kwargs,
    };
    if (h->api.tools && h->api.tool_choice != TD_API_TOOLS_NONE)
        h->tool_fmt = (td_tool_fmt_t)rt->tool_fmt;
    if (td_api_tool_forced(&h->api)) {
        td_buf_t pf;
        td_buf_init(&pf);
        if (td_tool_prefill(h->tool_fmt, h->api.tool_name, &pf) != 0) {
            td_buf_free(&pf);
            snprintf(msg, sizeof(msg),
                     "'tool_choice' forces a call, but this model's tool-call format is unknown "
                     "(set the router's tool_parser)");
            param = "tool_choice";
            goto fail;
        }
        h->prefill = td_buf_steal(&pf, NULL);
    }
    for (size_t i = 0; i < n_prompts; i++, n_toks++) {
        td_tokens_init(&toks[i]);
        if (kind == TD_API_COMPLETIONS)
            rc = prompt_tokens(rt, &h->api.prompts[i], &toks[i]);
        else
            rc = td_router_chat_render(rt, &h->api.msgs, &copts, h->prefill, &toks[i]);
        if (rc) {
            snprintf(msg, sizeof(msg), "%s", td_err_msg());
            param = kind == TD_API_COMPLETIONS  ? "prompt"
                    : kind == TD_API_RESPONSES ? "input"
                                               : "messages";
            n_toks++;
            goto fail;
        }
        if (toks[i].len == 0) {
            snprintf(msg, sizeof(msg), "the prompt is empty");
            param = "prompt";
            n_toks++;
            goto fail;
        }
    }
    if ((rc = td_api_tokenize_bad_words(&h->api, rt->tok, &param))) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        goto fail;
    }
    /* context length */
    size_t longest = 0;
    for (size_t i = 0; i < n_prompts; i++)
        longest = TD_MAX(longest, toks[i].len);
    const char *what = kind == TD_API_COMPLETIONS  ? "prompt"
                       : kind == TD_API_RESPONSES ? "input"
                                                  : "messages";
    if (longest >= (size_t)rt->max_ctx ||
        (h->api.max_tokens > 0 && longest + (uint64_t)h->api.max_tokens > (uint64_t)rt->max_ctx)) {
        if (h->api.max_tokens > 0)
            snprintf(msg, sizeof(msg),
                     "This model's maximum context length is %d tokens. However, you requested "
                     "%zu tokens (%zu in the %s, %" PRId64 " in the completion). Please reduce "
                     "the length of the %s or completion.",
                     rt->max_ctx, longest + (size_t)h->api.max_tokens, longest, what,
                     h->api.max_tokens, what);
        else
            snprintf(msg, sizeof(msg),
                     "This model's maximum context length is %d tokens. However, your %s "
                     "resulted in %zu tokens. Please reduce the length of the %s.",
                     rt->max_ctx, what, longest, what);
        param = what;
        code = "context_length_exceeded";
        goto fail;
    }
    /* the job */
    h->n_seqs = n_prompts * n;
    h->ch = td_calloc(h->n_seqs, sizeof(*h->ch));
    h->job = h->ch ? td_job_new(rt, &http_ops, h, h->n_seqs) : NULL;
    if (!h->job) {
        snprintf(msg, sizeof(msg), "out of memory");
        status = 500;
        goto fail;
    }
    td_job_t *j = h->job;
    for (size_t i = 0; i < h->n_seqs; i++) {
        td_buf_init(&h->ch[i].arena);
        if (h->tool_fmt != TD_TOOL_FMT_NONE) {
            if (td_tool_stream_init(&h->ch[i].ts, h->tool_fmt, h->prefill) != 0) {
                snprintf(msg, sizeof(msg), "out of memory");
                status = 500;
                goto fail;
            }
            if (td_tool_fmt_needs_special(h->tool_fmt)) /* the markers are special tokens */
                td_detok_init(&j->seqs[i].detok, false);
        }
    }
    td_sampling_t sp;
    td_api_sampling(&h->api, &sp);
    if (td_job_set_sampling(j, &sp)) {
        snprintf(msg, sizeof(msg), "out of memory");
        status = 500;
        goto fail;
    }
    size_t shortest_room = (size_t)rt->max_ctx - longest;
    j->sp.max_tokens = h->api.max_tokens > 0 ? (int32_t)h->api.max_tokens : (int32_t)shortest_room;
    uint64_t seed = h->api.has_seed           ? (uint64_t)h->api.seed
                    : h->api.temperature == 0 ? 0
                                              : td_router_random_seed();
    for (size_t i = 0; i < h->n_seqs; i++)
        if (td_job_set_prompt(j, (int)i, toks[i / n].ids, toks[i / n].len, seed + i % n)) {
            snprintf(msg, sizeof(msg), "out of memory");
            status = 500;
            goto fail;
        }
    size_t tenant_len = 0;
    const char *tenant = rt->cfg.tenant_header && *rt->cfg.tenant_header
                             ? td_http_header(r, rt->cfg.tenant_header, &tenant_len)
                             : NULL;
    if (key) { /* the key's tenant wins over any header */
        tenant = key->tenant;
        tenant_len = strlen(tenant);
        uint64_t reserve = (uint64_t)h->n_seqs * (uint64_t)j->sp.max_tokens;
        for (size_t i = 0; i < n_prompts; i++)
            reserve += (uint64_t)toks[i].len * n;
        if (!td__http_admit(rt, r, kind, key, reserve, &h->grant)) {
            for (size_t i = 0; i < n_toks; i++)
                td_tokens_free(&toks[i]);
            hjob_free(h);
            return;
        }
    }
    if (td_job_set_stop(j, h->api.stop, h->api.n_stop) ||
        (tenant && td_job_set_tenant(j, tenant, tenant_len))) {
        snprintf(msg, sizeof(msg), "out of memory");
        status = 500;
        goto fail;
    }
    if (h->api.echo && kind == TD_API_COMPLETIONS) {
        h->echo = td_calloc(n_prompts, sizeof(*h->echo));
        h->echo_len = td_calloc(n_prompts, sizeof(*h->echo_len));
        for (size_t i = 0; h->echo && h->echo_len && i < n_prompts; i++) {
            td_buf_t b;
            td_buf_init(&b);
            if (h->api.prompts[i].text)
                td_buf_append_str(&b, h->api.prompts[i].text);
            else
                td_tokenizer_decode(rt->tok, toks[i].ids, toks[i].len, true, &b);
            h->echo[i] = td_buf_steal(&b, &h->echo_len[i]);
        }
    }
    /* the response context */
    static const char *const id_prefix[] = {"cmpl-", "chatcmpl-", "msg_", "resp_"};
    static const char *const front[] = {"completions", "chat", "messages", "responses"};
    random_id(h->id, sizeof(h->id), id_prefix[kind]);
    h->ctx.kind = kind;
    h->ctx.id = h->id;
    td_job_set_client(j, front[kind], h->id, (size_t)n);
    if (kind == TD_API_RESPONSES) {
        random_id(h->msg_id, sizeof(h->msg_id), "msg_");
        h->rs.msg_id = h->msg_id;
        h->ctx.rs = &h->rs;
        h->ctx.max_output_tokens = h->api.max_tokens;
    }
    h->ctx.model = rt->model_name;
    h->ctx.created = (int64_t)time(NULL);
    h->ctx.include_usage = h->api.include_usage;
    h->ctx.logprobs = h->api.logprobs;
    h->ctx.prompt_tokens = (int64_t)toks[0].len;
    h->ctx.role_sent = h->role_sent;
    h->ctx.blocks = &h->blocks;
    h->ctx.head = &h->head;
    for (size_t i = 0; i < n_toks; i++)
        td_tokens_free(&toks[i]);
    n_toks = 0;
    rc = td_job_start(j);
    if (rc) {
        snprintf(msg, sizeof(msg), "%s", td_err_msg());
        status = rc == TD_EBUSY ? 503 : rc == TD_ERANGE ? 400 : 500;
        code = rc == TD_EBUSY ? "overloaded" : NULL;
        param = NULL;
        goto fail;
    }
    /* a stream starts with the first event (stream_open), so a request that fails before it
     * (no worker: 503 with Retry-After) gets its status; until then, and for a whole answer, the
     * client's connection is watched: a client gone cancels the request everywhere */
    h->req = r;
    td_http_req_watch(r, on_req_gone, h);
    return;
fail:
    for (size_t i = 0; i < n_toks; i++)
        td_tokens_free(&toks[i]);
    td__http_error(r, kind, status, param, code, msg);
    hjob_free(h);
}

static void h_completions(td_http_req_t *r, void *ud)
{
    handle_generate(ud, r, TD_API_COMPLETIONS);
}

static void h_chat(td_http_req_t *r, void *ud)
{
    handle_generate(ud, r, TD_API_CHAT);
}

static void h_responses(td_http_req_t *r, void *ud)
{
    handle_generate(ud, r, TD_API_RESPONSES);
}

static void h_messages(td_http_req_t *r, void *ud)
{
    handle_generate(ud, r, TD_API_MESSAGES);
}

int td_http_api_start(td_router_t *rt)
{
    td_http_opts_t o = {.max_body = rt->cfg.max_body, .server_name = "tandem-router"};
    rt->http = td_http_server_new(rt->loop, &o);
    if (!rt->http)
        return TD_ENOMEM;
    bool admin = rt->cfg.admin_listen && *rt->cfg.admin_listen;
    static const struct {
        const char *path;
        td_http_handler_fn fn;
        bool admin; /* served by the admin listener instead when there is one */
    } routes[] = {
        {"/v1/completions", h_completions, false},
        {"/v1/chat/completions", h_chat, false},
        {"/v1/messages", h_messages, false},
        {"/v1/responses", h_responses, false},
        {"/v1/models", td__http_models, false},
        {"/tokenize", td__http_tokenize, false},
        {"/detokenize", td__http_detokenize, false},
        {"/health", td__http_health, false},
        {"/metrics", td__http_metrics, true},
    };
    if (admin) {
        td_http_opts_t ao = {.max_body = 4096, .server_name = "tandem-router"};
        if (!(rt->admin = td_http_server_new(rt->loop, &ao)))
            return TD_ENOMEM;
    }
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        int rc = 0;
        if (!admin || !routes[i].admin)
            rc = td_http_route(rt->http, routes[i].path, routes[i].fn, rt);
        if (!rc && admin && (routes[i].admin || routes[i].fn == td__http_health))
            rc = td_http_route(rt->admin, routes[i].path, routes[i].fn, rt);
        if (rc)
            return rc;
    }
    if (admin) {
        int rc = td_http_listen(rt->admin, rt->cfg.admin_listen);
        if (rc)
            return td_err_set(rc, "http.admin_listen: %s", td_err_msg());
    }
    return td_http_listen(rt->http, rt->cfg.http_listen);
}
