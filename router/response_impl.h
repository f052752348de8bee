/* response_impl.h: the Responses API's formatting (response_responses.c), which response.c's
 * entry points call for TD_API_RESPONSES. The context's `rs` must be set. */
#ifndef TD_ROUTER_RESPONSE_IMPL_H
#define TD_ROUTER_RESPONSE_IMPL_H

#include "response.h"

int td__resp_r_delta(td_buf_t *out, const td_resp_ctx_t *c, const char *text, size_t len);
int td__resp_r_tool(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_tool_t *t);
int td__resp_r_finish(td_buf_t *out, const td_resp_ctx_t *c, td_resp_finish_t why);
int td__resp_r_done(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_usage_t *u);
int td__resp_r_error(td_buf_t *out, const td_resp_ctx_t *c, const char *type, const char *message);
int td__resp_r_full(td_buf_t *out, const td_resp_ctx_t *c, const td_resp_choice_t *ch,
                    const td_resp_usage_t *u);

#endif
