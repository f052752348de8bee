/* td_tokenizer.h: Hugging Face `tokenizer.json` byte-level BPE tokenizer, id for id equal to the
 * `tokenizers` library (the Rust crate behind transformers' fast tokenizers).
 *
 * Supported: model BPE (vocab, merges as "a b" strings or ["a","b"] pairs, ignore_merges);
 * normalizers Sequence, NFC, NFD, NFKC, NFKD (utf8proc); pre-tokenizers Sequence, Split (the file's
 * own regex or string, every behavior, invert; PCRE2 with UTF+UCP and the JIT), ByteLevel
 * (add_prefix_space, use_regex), Digits; added and special tokens (lstrip, rstrip, single_word,
 * normalized); post-processors ByteLevel, TemplateProcessing, Roberta/Bert, Sequence; decoder
 * ByteLevel. Anything else is refused at load time with TD_ENOTSUP and a message naming the field.
 *
 * Threads: a loaded tokenizer is immutable; every function here may be called from any number of
 * threads at once (encode keeps a small mutex-protected pool of per-call scratch: regex match
 * data, BPE work arrays and a bounded word cache).
 */
#ifndef TD_TOKENIZER_H
#define TD_TOKENIZER_H

#include "td_util.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_tokenizer td_tokenizer_t;

/* A growable array of token ids. The array owns `ids`; td_tokens_free releases it. */
typedef struct td_tokens {
    int32_t *ids; /* [len] token ids, each in [0, td_tokenizer_vocab_size) */
    size_t len;   /* ids in use */
    size_t cap;   /* ids allocated */
} td_tokens_t;

void td_tokens_init(td_tokens_t *t);
void td_tokens_free(td_tokens_t *t);
/* Append one id. 0 or TD_ENOMEM. */
int td_tokens_push(td_tokens_t *t, int32_t id);

/* Load a tokenizer from `path`: a model directory holding tokenizer.json (and optionally
 * tokenizer_config.json), or the tokenizer.json file itself (tokenizer_config.json is then looked
 * for beside it). On success *out owns the tokenizer (td_tokenizer_free). On failure returns
 * TD_ENOENT / TD_EIO (file), TD_EPARSE (malformed JSON or field), TD_ENOTSUP (a component this
 * implementation lacks) or TD_ENOMEM, and td_err_msg() names the file and the field. */
int td_tokenizer_load(const char *path, td_tokenizer_t **out);

/* Load from memory. `json` is the tokenizer.json text (`len` bytes); `config`/`config_len` the
 * tokenizer_config.json text or NULL/0. `name` is used in error messages in place of a file name.
 * Same errors as td_tokenizer_load. */
int td_tokenizer_load_mem(const char *json, size_t len, const char *config, size_t config_len,
                          const char *name, td_tokenizer_t **out);

void td_tokenizer_free(td_tokenizer_t *tok);

/* Encode `len` bytes of UTF-8 text and append the ids to `out`. Invalid UTF-8 is first replaced
 * by U+FFFD, one per maximal invalid subsequence (as a JavaScript or Rust lossy conversion does).
 * Added and special tokens written in the text are always recognised (unless the tokenizer's
 * tokenizer_config.json sets split_special_tokens, which turns that off for special ones, as HF
 * does); `add_special_tokens` only controls the post-processor's BOS/EOS. Memory use is
 * proportional to `len`. 0, TD_ENOMEM, or TD_EINTERNAL when the regex engine fails (message says
 * why). On error `out` may hold a partial result. */
int td_tokenizer_encode(const td_tokenizer_t *tok, const char *text, size_t len,
                        bool add_special_tokens, td_tokens_t *out);

/* Decode `n` ids and append the text to `out` (NUL-terminated). Byte sequences that are not valid
 * UTF-8 become U+FFFD the way HF decode does; added tokens are written verbatim and special ones
 * left out when `skip_special_tokens`. 0, TD_ENOMEM, or TD_ERANGE for an id that names no token
 * (td_err_msg gives the id and its index; HF silently drops such ids). */
int td_tokenizer_decode(const td_tokenizer_t *tok, const int32_t *ids, size_t n,
                        bool skip_special_tokens, td_buf_t *out);

/* Append the raw bytes of token `id` to `out`: its byte-level bytes exactly (a token may hold
 * part of a UTF-8 character; nothing is replaced), an added token's text verbatim. Logprobs'
 * `bytes` report these. 0, TD_ENOMEM, or TD_ERANGE for an id that names no token. */
int td_tokenizer_token_bytes(const td_tokenizer_t *tok, int32_t id, td_buf_t *out);

/* Incremental (streaming) decoding state for one sequence. Caller-allocated, no resources: a
 * sequence that is abandoned needs no cleanup. */
typedef struct td_detok {
    uint8_t part[4];   /* bytes of an incomplete UTF-8 sequence not yet emitted */
    uint8_t npart;     /* bytes in part, 0..3 */
    uint8_t need;      /* total bytes the sequence in part needs, 2..4 (0 when npart is 0) */
    bool skip_special; /* leave special tokens out, as td_tokenizer_decode's flag */
} td_detok_t;

void td_detok_init(td_detok_t *st, bool skip_special_tokens);

/* Feed one id; append to `out` only complete UTF-8 text (possibly nothing). Bytes of a character
 * that spans tokens are held until it completes; bytes that can never form a valid character are
 * emitted as U+FFFD as soon as that is certain. The concatenation of everything appended by the
 * steps and td_detok_finish equals td_tokenizer_decode of the same ids. 0, TD_ENOMEM or
 * TD_ERANGE (unknown id; the state is unchanged). */
int td_detok_step(const td_tokenizer_t *tok, td_detok_t *st, int32_t id, td_buf_t *out);

/* End of stream: an incomplete sequence still held becomes one U+FFFD. 0 or TD_ENOMEM. */
int td_detok_finish(const td_tokenizer_t *tok, td_detok_t *st, td_buf_t *out);

/* Number of ids: one more than the largest id of the vocabulary or an added token. */
size_t td_tokenizer_vocab_size(const td_tokenizer_t *tok);

/* The id of the token whose text (as written in tokenizer.json: byte-level form for the model
 * vocabulary, verbatim for added tokens) is [token, token+len), or -1. Added tokens first. */
int32_t td_tokenizer_token_to_id(const td_tokenizer_t *tok, const char *token, size_t len);

/* The text of token `id` as written in tokenizer.json, or NULL for an id that names no token.
 * *len receives its length. Valid as long as the tokenizer. */
const char *td_tokenizer_id_to_token(const td_tokenizer_t *tok, int32_t id, size_t *len);

/* Whether `id` is an added token marked special (skipped by skip_special_tokens). */
bool td_tokenizer_is_special(const td_tokenizer_t *tok, int32_t id);

/* The id of a named special token from tokenizer_config.json: "bos", "eos", "pad" or "unk"
 * (bos_token, eos_token, ... there), or -1 when not set or not in the vocabulary. */
int32_t td_tokenizer_special_id(const td_tokenizer_t *tok, const char *name);

#endif
