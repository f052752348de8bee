/* api_impl.h: what the parts of the request parser (api.c: sampling, prompts, the three APIs;
 * api_tools.c: tools, tool_choice and Anthropic content blocks; api_responses.c: Responses
 * input items) share. Internal to the router. */
#ifndef TD_ROUTER_API_IMPL_H
#define TD_ROUTER_API_IMPL_H

#include "api.h"

#include <json-c/json.h>

/* Parse state: the error's parameter name travels with the code. */
typedef struct td_api_ctx {
    const char *param;
    const char *body; /* the request body, for echoing a number json-c saturated */
    size_t len;
} td_api_ctx_t;

/* Set td_err_msg and the parameter; returns code. `param` must outlive the parse (static, or
 * from td__api_param). */
int td__api_fail(td_api_ctx_t *c, const char *param, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A parameter name built from parts (`tools[1].function.name`), valid until the next call. */
const char *td__api_param(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* o[key], NULL when absent or null. */
json_object *td__api_field(json_object *o, const char *key);
/* "a string", "an object", ... for messages. */
const char *td__api_type_name(json_object *v);

/* OpenAI chat `tools` and `tool_choice` into r. */
int td__api_tools_openai(td_api_ctx_t *c, json_object *o, td_api_request_t *r);
/* Anthropic `tools` and `tool_choice` into r (converted to OpenAI's form). */
int td__api_tools_anthropic(td_api_ctx_t *c, json_object *o, td_api_request_t *r);
/* Anthropic `system` and `messages` (text, tool_use and tool_result blocks) as an OpenAI-style
 * message array (*out, the caller's). */
int td__api_anthropic_messages(td_api_ctx_t *c, json_object *sys, json_object *msgs,
                               json_object **out);

/* A Responses body's input, instructions, tools and tool_choice into r (api_responses.c). */
int td__api_responses(td_api_ctx_t *c, json_object *o, td_api_request_t *r);

#endif
