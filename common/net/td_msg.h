/* td_msg.h: control-plane messages that more than one program builds or reads, built in one
 * place: the sampling settings of a request (the engine's td_sampling_t <-> the proto's Sampling)
 * and the Error frame.
 */
#ifndef TD_MSG_H
#define TD_MSG_H

#include "control.pb-c.h"
#include "td_rpc.h"
#include "td_sampler.h"

/* The proto form of `p`, for a request whose random stream starts at `seed`. `out` points into
 * `p` (its stop ids, logit_bias, bad_words): `p` and what it points to must outlive every use
 * of `out`. */
void td_msg_sampling_to_proto(const td_sampling_t *p, uint64_t seed, Tandem__Sampling *out);

/* The engine form of `sp` (NULL: greedy defaults). Proto zeros mean "unset": top_p 0 is 1, a
 * negative top_k is 0, max_tokens 0 is no limit; eos_id is left at -1 for the caller.
 * 0, or TD_EINVAL (more than TD_SAMPLER_MAX_STOP stop ids, top_p outside [0, 1], logprobs
 * outside -1..20, logit_bias lists of unequal length, bad_words lengths that do not add up;
 * td_err_msg names the field). `p` points into `sp` (logit_bias, bad_words) until
 * td_sampler_init copies them. */
int td_msg_sampling_from_proto(const Tandem__Sampling *sp, td_sampling_t *p);

/* Send Error{code, message, request_id} on `c` (NULL: nothing is sent). 0 or the send's error. */
int td_msg_send_error(td_rpc_conn_t *c, uint64_t request_id, int code, const char *message);

#endif
