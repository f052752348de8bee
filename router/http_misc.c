/* http_misc.c: the HTTP API's endpoints besides generation: /v1/models, vLLM's /tokenize and
 * /detokenize, /health and /metrics. */
#include "router.h"

#include "auth.h"
#include "http_impl.h"
#include "td_error.h"
#include "td_util.h"

#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static bool authorized(td_router_t *rt, td_http_req_t *r, td_api_kind_t kind)
{
    td_apikey_t *k;
    return td__http_authorized(rt, r, kind, &k);
}

static void respond_json(td_http_req_t *r, int status, td_buf_t *b)
{
    if (b->data)
        td_http_respond(r, status, "application/json", b->data, b->len);
    else
        td_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
}

void td__http_models(td_http_req_t *r, void *ud)
{
    td_router_t *rt = ud;
    if (!td__http_method_is(r, "GET", TD_API_CHAT) || !authorized(rt, r, TD_API_CHAT))
        return;
    td_buf_t b;
    td_buf_init(&b);
    td_buf_append_str(&b, "{\"object\":\"list\",\"data\":[{\"id\":");
    td_buf_append_json_string(&b, rt->model_name, strlen(rt->model_name));
    td_buf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"tandem\",\"root\":",
                  (long long)time(NULL));
    td_buf_append_json_string(&b, rt->cfg.model, strlen(rt->cfg.model));
    td_buf_printf(&b, ",\"parent\":null,\"max_model_len\":%d,\"permission\":[]}]}", rt->max_ctx);
    respond_json(r, 200, &b);
    td_buf_free(&b);
}

void td__http_tokenize(td_http_req_t *r, void *ud)
{
    td_router_t *rt = ud;
    if (!td__http_method_is(r, "POST", TD_API_COMPLETIONS) || !authorized(rt, r, TD_API_COMPLETIONS))
        return;
    size_t len;
    const char *body = td_http_body(r, &len);
    json_object *o, *p = NULL, *m = NULL, *v = NULL;
    td_tokens_t t;
    td_tokens_init(&t);
    if (td_api_parse_object(body, len, &o) != 0) {
        td_http_respond_error(r, 400, "invalid_request_error", NULL, NULL, "%s", td_err_msg());
        goto out;
    }
    json_object_object_get_ex(o, "prompt", &p);
    json_object_object_get_ex(o, "messages", &m);
    if (json_object_object_get_ex(o, "model", &v) &&
        !(json_object_is_type(v, json_type_string) &&
          strcmp(json_object_get_string(v), rt->model_name) == 0)) {
        td_http_respond_error(r, 404, "not_found_error", "model", "model_not_found",
                              "The model `%.200s` does not exist.", json_object_get_string(v));
        goto out;
    }
    int rc;
    if (p && json_object_is_type(p, json_type_string)) {
        bool special = true;
        if (json_object_object_get_ex(o, "add_special_tokens", &v))
            special = json_object_get_boolean(v);
        rc = td_tokenizer_encode(rt->tok, json_object_get_string(p),
                                 (size_t)json_object_get_string_len(p), special, &t);
    } else if (m && json_object_is_type(m, json_type_array)) {
        bool gen = true;
        if (json_object_object_get_ex(o, "add_generation_prompt", &v))
            gen = json_object_get_boolean(v);
        td_chat_msgs_t msgs = {0};
        rc = td_chat_msgs_from_json(&msgs, m);
        if (!rc)
            rc = td_router_chat_tokens(rt, &msgs, gen, false, &t);
        td_chat_msgs_free(&msgs);
    } else {
        td_http_respond_error(r, 400, "invalid_request_error", "prompt", NULL,
                              "give 'prompt' (a string) or 'messages' (an array)");
        goto out;
    }
    if (rc) {
        td_http_respond_error(r, 400, "invalid_request_error", p ? "prompt" : "messages", NULL,
                              "%s", td_err_msg());
        goto out;
    }
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b, "{\"count\":%zu,\"max_model_len\":%d,\"tokens\":[", t.len, rt->max_ctx);
    for (size_t i = 0; i < t.len; i++)
        td_buf_printf(&b, "%s%d", i ? "," : "", t.ids[i]);
    td_buf_append_str(&b, "],\"token_strs\":null}");
    respond_json(r, 200, &b);
    td_buf_free(&b);
out:
    td_tokens_free(&t);
    if (o)
        json_object_put(o);
}

void td__http_detokenize(td_http_req_t *r, void *ud)
{
    td_router_t *rt = ud;
    if (!td__http_method_is(r, "POST", TD_API_COMPLETIONS) || !authorized(rt, r, TD_API_COMPLETIONS))
        return;
    size_t len;
    const char *body = td_http_body(r, &len);
    json_object *o, *a = NULL;
    td_tokens_t t;
    td_tokens_init(&t);
    if (td_api_parse_object(body, len, &o) != 0) {
        td_http_respond_error(r, 400, "invalid_request_error", NULL, NULL, "%s", td_err_msg());
        goto out;
    }
    if (!json_object_object_get_ex(o, "tokens", &a) || !json_object_is_type(a, json_type_array)) {
        td_http_respond_error(r, 400, "invalid_request_error", "tokens", NULL,
                              "the body must be a JSON object with 'tokens' (an array of ids)");
        goto out;
    }
    for (size_t i = 0; i < json_object_array_length(a); i++) {
        json_object *e = json_object_array_get_idx(a, i);
        int64_t id = json_object_get_int64(e);
        if (!json_object_is_type(e, json_type_int) || id < 0 ||
            (uint64_t)id >= td_tokenizer_vocab_size(rt->tok)) {
            td_http_respond_error(r, 400, "invalid_request_error", "tokens", NULL,
                                  "tokens[%zu] is not a token id of this model", i);
            goto out;
        }
        td_tokens_push(&t, (int32_t)id);
    }
    td_buf_t text, b;
    td_buf_init(&text);
    td_buf_init(&b);
    if (td_tokenizer_decode(rt->tok, t.ids, t.len, false, &text) != 0) {
        td_http_respond_error(r, 400, "invalid_request_error", "tokens", NULL, "%s", td_err_msg());
    } else {
        td_buf_append_str(&b, "{\"prompt\":");
        td_buf_append_json_string(&b, text.data ? text.data : "", text.len);
        td_buf_append_char(&b, '}');
        respond_json(r, 200, &b);
    }
    td_buf_free(&text);
    td_buf_free(&b);
out:
    td_tokens_free(&t);
    if (o)
        json_object_put(o);
}

void td__http_health(td_http_req_t *r, void *ud)
{
    td_router_t *rt = ud;
    size_t dec = 0, pre = 0;
    for (size_t i = 0; i < rt->n_workers; i++) {
        const td_worker_t *w = rt->workers[i];
        if (!w->load.alive || w->load.draining)
            continue;
        if (w->role == TANDEM__ROLE__ROLE_DECODE)
            dec++;
        else
            pre++;
    }
    td_buf_t b;
    td_buf_init(&b);
    td_buf_printf(&b, "{\"status\":\"%s\",\"decode_workers\":%zu,\"prefill_workers\":%zu}",
                  dec ? "ok" : "unavailable", dec, pre);
    respond_json(r, dec && !rt->stopping ? 200 : 503, &b);
    td_buf_free(&b);
}

void td__http_metrics(td_http_req_t *r, void *ud)
{
    td_router_t *rt = ud;
    td_buf_t b;
    td_buf_init(&b);
    if (td_metrics_render(rt->metrics, &b) != 0 || !b.data)
        td_http_respond_error(r, 500, "server_error", NULL, NULL, "out of memory");
    else
        td_http_respond(r, 200, "text/plain; version=0.0.4; charset=utf-8", b.data, b.len);
    td_buf_free(&b);
}

