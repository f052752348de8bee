/* td_sampler.h: choosing the next token from logits, per request.
 *
 * Each request owns a td_sampler_t with its own random stream (xoshiro256** seeded from the
 * request's seed) that advances exactly once per sampled token, so the same seed gives the same
 * output whatever else shares the batch. Reported logprobs are those of the model's raw
 * distribution (log-softmax of the logits, before temperature and filters).
 *
 * Order (vLLM's): the logits are first adjusted (td_sampler_adjust, in this order: min_tokens
 * masks EOS and the stop ids, logit_bias adds, bad_words bans, then the repetition penalty over
 * the prompt and the generated tokens, then the frequency and presence penalties over the
 * generated tokens); then temperature, then top-k, top-p and min-p filters on the tempered
 * distribution, then one uniform draw. temperature == 0 is greedy over the adjusted logits (the
 * lowest id among equal maxima). Adjustments change which token is chosen, never the reported
 * logprobs.
 */
#ifndef TD_SAMPLER_H
#define TD_SAMPLER_H

#include "td_jsonfsm.h"
#include "td_rng.h"

#include <stdbool.h>
#include <stdint.h>

#define TD_SAMPLER_MAX_LOGPROBS 20
#define TD_SAMPLER_MAX_STOP 16
#define TD_SAMPLER_MAX_BIAS 1024     /* logit_bias entries */
#define TD_SAMPLER_MAX_BAD 4096      /* bad_words: tokens over all sequences */

typedef struct td_sampling {
    float temperature; /* 0: greedy; > 0 */
    int top_k;         /* 0: off */
    float top_p;       /* (0, 1]; 1: off */
    float min_p;       /* [0, 1]; 0: off */
    uint64_t seed;     /* the request's seed */
    int max_tokens;    /* finish with TD_FINISH_LENGTH after this many; 0: no limit */
    int32_t stop_ids[TD_SAMPLER_MAX_STOP]; /* finish with TD_FINISH_STOP on any of these */
    int n_stop;
    int32_t eos_id;  /* -1: none */
    bool ignore_eos; /* keep going past EOS */
    int logprobs;    /* -1: no logprob records; else the sampled token's logprob plus this many
                        alternatives, 0..TD_SAMPLER_MAX_LOGPROBS */
    /* -- penalties and biases (docs/sampling.md): 0 / 1 / empty is off */
    float presence_penalty;   /* [-2, 2]: minus this once for every token generated at all */
    float frequency_penalty;  /* [-2, 2]: minus this times the token's generated count */
    float repetition_penalty; /* (0, 100]; 1: off. A token in the prompt or generated: a
                                 positive logit divided by it, a negative one multiplied */
    int min_tokens;           /* EOS and the stop ids cannot be sampled before this many */
    /* borrowed for td_sampler_init, which copies them */
    const int32_t *logit_bias_ids;  /* [n_logit_bias] */
    const float *logit_bias_values; /* [n_logit_bias] in [-100, 100], added to the logit */
    int n_logit_bias;
    const int32_t *bad_words;     /* the sequences' tokens, one after another */
    const uint32_t *bad_word_len; /* [n_bad_words] each sequence's length (>= 1) */
    int n_bad_words;
    /* -- structured outputs (td_jsonfsm.h): the worker compiles these into a td_jsonmask_t and
     *    hands it to td_sampler_set_mask */
    int json_mode;           /* 0: off, 1: any JSON object, 2: json_schema */
    const char *json_schema; /* json_mode 2: the schema's JSON text, NUL-terminated (borrowed) */
    size_t json_schema_len;
} td_sampling_t;

/* Defaults: greedy, no filters, no limit, no EOS, no logprobs (-1). */
void td_sampling_defaults(td_sampling_t *p);

typedef enum td_finish {
    TD_FINISH_NONE = 0, /* keep generating */
    TD_FINISH_STOP,     /* a stop id or EOS was produced (it is the last token) */
    TD_FINISH_LENGTH,   /* max_tokens reached */
} td_finish_t;

typedef struct td_logprob {
    int32_t id;
    float logprob; /* natural log */
} td_logprob_t;

typedef struct td_sample {
    int32_t token;
    float logprob;                             /* of `token` under the raw distribution */
    td_logprob_t top[TD_SAMPLER_MAX_LOGPROBS]; /* [n_top] most likely tokens, best first */
    int n_top;
    td_finish_t finish; /* state after this token */
} td_sample_t;

/* What a draw (temperature > 0) works in: vocabulary-sized arrays, written in full before they
 * are read. Samplers used one at a time on a thread can share one (td_sampler_sample_in); each
 * sampler otherwise allocates its own at its first draw, so a request never pays for them at
 * set-up nor when it is greedy. */
typedef struct td_sampler_scratch {
    float *prob;  /* [cap] tempered probabilities */
    int32_t *idx; /* [cap] candidate ids */
    int cap;
} td_sampler_scratch_t;

/* Room for vocab entries in *sc. 0 or TD_ENOMEM. */
int td_sampler_scratch_reserve(td_sampler_scratch_t *sc, int vocab);
void td_sampler_scratch_free(td_sampler_scratch_t *sc);

typedef struct td_sampler {
    td_sampling_t p;
    int vocab;
    td_rng_t rng; /* xoshiro256** state */
    int n_generated;
    td_sampler_scratch_t own; /* draws' scratch when the caller lends none (td_sampler_sample) */
    /* adjustments (NULL when the parameters need none) */
    float *adj;           /* [vocab] scratch: the adjusted logits */
    int32_t *bias_ids;     /* own copies of p.logit_bias_* */
    float *bias_values;
    int32_t *bad;          /* own copy of p.bad_words */
    uint32_t *bad_len;
    uint32_t *count;       /* [vocab] generated count per token (penalties) */
    uint8_t *seen;         /* [vocab] in the prompt or generated (repetition penalty) */
    int32_t *hist;         /* [n_hist] the generated tokens (bad_words) */
    td_jsonmask_t *mask;   /* structured outputs: tokens outside it are never chosen; owned */
    int n_hist, cap_hist;
} td_sampler_t;

/* Validate the parameters and set up a sampler for a vocabulary of `vocab` tokens.
 * 0, TD_EINVAL (td_err_msg names the parameter) or TD_ENOMEM. */
int td_sampler_init(td_sampler_t *s, const td_sampling_t *p, int vocab);
void td_sampler_free(td_sampler_t *s);

/* Choose the next token from logits[vocab] and say whether the request is finished. A draw
 * works in the sampler's own scratch, allocated at its first draw. */
void td_sampler_sample(td_sampler_t *s, const float *logits, td_sample_t *out);
/* The same, working in sc (td_sampler_scratch_reserve'd for the vocabulary beforehand, or grown
 * here): the engine lends one to all the samplers of its steps. Where sc cannot be grown (out of
 * memory), the token is the greedy one (the random stream still advances) and the error is
 * logged. */
void td_sampler_sample_in(td_sampler_t *s, const float *logits, td_sample_t *out,
                          td_sampler_scratch_t *sc);
/* Take `token` as the next token sampled elsewhere with the same parameters (a prefill worker
 * sampled the first token): advance the random stream exactly as td_sampler_sample would have and
 * return the finish state after it. Continuing with td_sampler_sample then gives the same tokens
 * as if this sampler had drawn `token` itself. */
td_finish_t td_sampler_accept(td_sampler_t *s, int32_t token);
/* Put the sampler at position n: as if it had just sampled n tokens (from its seed, whatever it
 * did before): the random stream advanced by exactly what those n draws took and n counted
 * towards max_tokens. A sequence resumed on another worker after n generated tokens (migration)
 * continues with the tokens an uninterrupted run would have given. */
void td_sampler_seek(td_sampler_t *s, int n);
/* Tell the sampler the sequence's tokens: toks[0..n) of which the last `generated` were
 * generated (a migrated sequence resumed, or 0 for a new one). It resets what the penalties and
 * bad_words look at (counts of generated tokens, tokens seen) to exactly that, so a resumed
 * sequence samples as the uninterrupted one would. Call after init (and after seek). 0 or
 * TD_ENOMEM. */
int td_sampler_context(td_sampler_t *s, const int32_t *toks, int n, int generated);
/* Constrain the output by `m` (structured outputs; the sampler owns it from now on): a token it
 * does not allow is never chosen, EOS only once the output is complete. Where the mask allows no
 * token at all (a vocabulary lacking the bytes needed) EOS is chosen. Call before sampling and
 * before td_sampler_context. 0 or TD_ENOMEM. */
int td_sampler_set_mask(td_sampler_t *s, td_jsonmask_t *m);
/* Whether the parameters adjust logits at all (the engine may skip td_sampler_adjust). */
bool td_sampler_adjusts(const td_sampler_t *s);

#endif
