/* tokenizer_load_impl.h: what the loader's files share: the load context, the JSON field readers
 * (each error names the file and the field in dotted JSON-path form), the table builders, and one
 * parser per section of tokenizer.json / tokenizer_config.json. Only tokenizer_load*.c and
 * tokenizer_tables.c include it. */
#ifndef TD_TOKENIZER_LOAD_IMPL_H
#define TD_TOKENIZER_LOAD_IMPL_H

#include "tokenizer_impl.h"

#include <json-c/json.h>

/* One file being read into a tokenizer. */
typedef struct td__ld {
    td_tokenizer_t *tok; /* what the sections fill in */
    const char *file;    /* file name for messages */
} td__ld_t;

/* ---- JSON field readers (tokenizer_load.c). Each returns 0 or TD_EPARSE with a message. */

/* The JSON type name of o, "null" for NULL. */
const char *td__jtype_name(json_object *o);
/* Field `key` of object `o` (NULL if absent, JSON null, or o is not an object). */
json_object *td__tok_jget(json_object *o, const char *key);
/* v must be present and of type t; `field` is its path for the message. */
int td__want_type(td__ld_t *L, json_object *v, json_type t, const char *field);
/* Optional boolean o.key (path: o's path): absent/null gives `dflt`. */
int td__opt_bool(td__ld_t *L, json_object *o, const char *key, const char *path, bool dflt,
                 bool *out);
/* Required string o.key: *s and *n point into o (valid while o lives). */
int td__req_string(td__ld_t *L, json_object *o, const char *key, const char *path, const char **s,
                   size_t *n);

/* ---- tables (tokenizer_tables.c) */

/* Copy n bytes (plus a NUL) into tok->arena; *off gets their offset. 0, TD_ENOMEM, or TD_EOVERFLOW
 * past 4 GiB. A pointer into the arena is valid only until the next add. */
int td__arena_add(td_tokenizer_t *tok, const void *p, size_t n, uint32_t *off);
/* An empty map with room for `want` keys at half load. 0 or TD_ENOMEM. */
int td__strmap_init(td__strmap_t *m, size_t want);
/* Insert or overwrite; the key must already be in the arena at `off`, and the map have room. */
void td__strmap_put(td_tokenizer_t *tok, td__strmap_t *m, uint32_t off, uint32_t len, int32_t id);
/* An empty merge table with room for `want` pairs (ranks 0..want-1) at half load. 0 or
 * TD_ENOMEM. */
int td__mergemap_init(td__mergemap_t *m, size_t want);
/* Insert pair (left, right) of merge `rank` producing `id`, or overwrite it: later duplicates
 * win, as in HF. left and right at most TD__MERGE_ID_MAX, rank below the `want` of init. */
void td__mergemap_put(td__mergemap_t *m, int32_t left, int32_t right, uint32_t rank, int32_t id);
/* After the `nranks` puts: note whether ids follow ranks at a fixed offset (by_offset). */
void td__mergemap_done(td__mergemap_t *m, size_t nranks);
/* Fill tok->byte_char / byte_char_len with GPT-2's bytes_to_unicode. */
void td__byte_level_init(td_tokenizer_t *tok);
/* The byte whose byte-level char is cp, -1 when cp is not a byte-level char. Thread-safe. */
int td__byte_of_char(uint32_t cp);

/* ---- sections. Each returns 0 or a negative TD_E* code with a message naming the field. */

/* Make ids[0..id] exist (new ones: no token). 0 or TD_ENOMEM. (tokenizer_load_model.c) */
int td__ensure_id(td_tokenizer_t *tok, int64_t id);
/* "model": vocab, merges, unk_token, and byte_id. (tokenizer_load_model.c) */
int td__parse_model(td__ld_t *L, json_object *m);
/* "normalizer" (NULL: none) into the utf8proc flags *flags. (tokenizer_load_pretok.c) */
int td__parse_normalizer(td__ld_t *L, json_object *n, const char *path, int *flags);
/* "pre_tokenizer" p at `path`; `last` says whether it is the final step (ByteLevel must be), and
 * *have_bl becomes true once ByteLevel is seen. (tokenizer_load_pretok.c) */
int td__parse_pretok(td__ld_t *L, json_object *p, const char *path, bool last, bool *have_bl);
/* "added_tokens" (NULL: none), after the model and the normalizer. (tokenizer_load_added.c) */
int td__parse_added(td__ld_t *L, json_object *arr);
/* After the pre-tokenizer: the class table its hand-matched patterns read.
 * (tokenizer_load_pretok.c) */
void td__pretok_fast_init(td__ld_t *L);
/* "post_processor" (NULL: none): the prefix and suffix ids. (tokenizer_load_post.c) */
int td__parse_post(td__ld_t *L, json_object *p, const char *path);
/* "decoder": must be ByteLevel, alone or in a one-element Sequence. (tokenizer_load_post.c) */
int td__parse_decoder(td__ld_t *L, json_object *d, const char *path);
/* tokenizer_config.json: the special token ids, split_special_tokens, and add_bos_token /
 * add_eos_token, which replace the post-processor's ids. Last, after everything else. */
int td__parse_config(td__ld_t *L, json_object *cfg);

#endif
