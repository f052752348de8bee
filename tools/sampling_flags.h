/* sampling_flags.h: the sampling flags that `tandem generate` (cmd_generate.c) and `tandem ctl
 * generate` (cmd_ctl.c) share, parsed once, strictly, into the engine's td_sampling_t:
 *
 *   --max-tokens N   1..2^20 tokens to generate
 *   --temperature T  >= 0, 0 = greedy
 *   --top-k K        0..2^24, 0 = off
 *   --top-p P        (0, 1], 1 = off
 *   --min-p P        [0, 1], 0 = off
 *   --seed N         unsigned 64-bit
 *   --stop-ids LIST  up to TD_SAMPLER_MAX_STOP comma-separated token ids
 *   --ignore-eos     keep generating past the end-of-sequence token
 *   --logprobs N     -1 (none) .. TD_SAMPLER_MAX_LOGPROBS: the sampled token's logprob plus N
 *                    alternatives
 *   --presence-penalty X, --frequency-penalty X   [-2, 2]
 *   --repetition-penalty X                          (0, 100], 1 = off
 *   --min-tokens N   EOS and the stop ids masked before N tokens
 *   --logit-bias LIST  comma-separated ID:BIAS pairs, BIAS in [-100, 100] (the last
 *                    --logit-bias given wins; its lists live until the process ends)
 *
 * A command puts TD_SAMPLING_FLAG_OPTIONS into its getopt_long table, starts from
 * td_sampling_defaults (plus its own max_tokens default), and hands every option for which
 * td_sampling_flags_has is true to td_sampling_flags_apply. */
#ifndef TD_SAMPLING_FLAGS_H
#define TD_SAMPLING_FLAGS_H

#include "td_sampler.h"

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* getopt_long values of the sampling flags; above any command's own (which start at 256). */
enum {
    TD_SAMPLING_FLAG_MAX_TOKENS = 0x1000,
    TD_SAMPLING_FLAG_TEMPERATURE,
    TD_SAMPLING_FLAG_TOP_K,
    TD_SAMPLING_FLAG_TOP_P,
    TD_SAMPLING_FLAG_MIN_P,
    TD_SAMPLING_FLAG_SEED,
    TD_SAMPLING_FLAG_STOP_IDS,
    TD_SAMPLING_FLAG_IGNORE_EOS,
    TD_SAMPLING_FLAG_LOGPROBS,
    TD_SAMPLING_FLAG_PRESENCE,
    TD_SAMPLING_FLAG_FREQUENCY,
    TD_SAMPLING_FLAG_REPETITION,
    TD_SAMPLING_FLAG_MIN_TOKENS,
    TD_SAMPLING_FLAG_LOGIT_BIAS,
    TD_SAMPLING_FLAG_END, /* one past the last */
};

/* The struct option entries of the sampling flags, for a getopt_long table. */
#define TD_SAMPLING_FLAG_OPTIONS                                                                   \
    {"max-tokens", required_argument, 0, TD_SAMPLING_FLAG_MAX_TOKENS},                             \
        {"temperature", required_argument, 0, TD_SAMPLING_FLAG_TEMPERATURE},                       \
        {"top-k", required_argument, 0, TD_SAMPLING_FLAG_TOP_K},                                   \
        {"top-p", required_argument, 0, TD_SAMPLING_FLAG_TOP_P},                                   \
        {"min-p", required_argument, 0, TD_SAMPLING_FLAG_MIN_P},                                   \
        {"seed", required_argument, 0, TD_SAMPLING_FLAG_SEED},                                     \
        {"stop-ids", required_argument, 0, TD_SAMPLING_FLAG_STOP_IDS},                             \
        {"ignore-eos", no_argument, 0, TD_SAMPLING_FLAG_IGNORE_EOS},                               \
        {"presence-penalty", required_argument, 0, TD_SAMPLING_FLAG_PRESENCE},                     \
        {"frequency-penalty", required_argument, 0, TD_SAMPLING_FLAG_FREQUENCY},                   \
        {"repetition-penalty", required_argument, 0, TD_SAMPLING_FLAG_REPETITION},                 \
        {"min-tokens", required_argument, 0, TD_SAMPLING_FLAG_MIN_TOKENS},                         \
        {"logit-bias", required_argument, 0, TD_SAMPLING_FLAG_LOGIT_BIAS},                         \
    {                                                                                              \
        "logprobs", required_argument, 0, TD_SAMPLING_FLAG_LOGPROBS                                \
    }

/* Whether getopt_long's value `opt` is one of the sampling flags. */
bool td_sampling_flags_has(int opt);

/* Apply sampling flag `opt` with its argument `arg` (NULL for --ignore-eos) to sp.
 * 0, or TD_EINVAL with td_err_msg naming the flag and the value. */
int td_sampling_flags_apply(int opt, const char *arg, td_sampling_t *sp);

/* An integer flag value in [lo, hi] (also for a command's own flags). 0 or TD_EINVAL naming
 * `flag`. */
int td_sampling_flags_parse_int(const char *flag, const char *s, int lo, int hi, int *out);

/* A comma-separated list of token ids ("1,2,3"), for --stop-ids and --prompt-ids: *out gets a
 * malloc'd array of *n >= 1 ids (the caller frees it). Each element is plain decimal digits (with
 * `signed_ids`, optionally after a '-': any int32, for tools that hash raw ids): an empty element
 * ("3,,4", "1,"), a '+', a space, hex or a value outside the range is refused, and a leading 0 is
 * decimal, not octal. 0, TD_ENOMEM, or TD_EINVAL with a message naming `flag` and the element
 * (counted from 1). */
int td_sampling_flags_parse_ids(const char *flag, const char *s, bool signed_ids, int32_t **out,
                                size_t *n);

#endif
