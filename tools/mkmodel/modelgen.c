/* modelgen.c: the entry points of the model generator (td_modelgen.h): option parsing, the order
 * in which the files are written, and the helpers that write them. The parts live in
 * modelgen_arch.c (hyperparameters, tensor lists), modelgen_values.c (weights and number formats),
 * modelgen_config.c (tokenizer, config.json), modelgen_safetensors.c and modelgen_gguf.c. */
#include "modelgen_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------ */
/* Output files                                                                                */
/* ------------------------------------------------------------------------------------------ */

int td__mg_file_open(mg_file_t *mf, const char *dir, const char *name)
{
    td_buf_t p;
    td_buf_init(&p);
    if (td_buf_printf(&p, "%s/%s", dir, name) != 0)
        return TD_ENOMEM;
    mf->path = td_buf_steal(&p, NULL);
    mf->f = fopen(mf->path, "wb");
    if (!mf->f) {
        int e = errno;
        int err = td_err_set(td_err_from_errno(e), "%s: %s", mf->path, strerror(e));
        free(mf->path);
        mf->path = NULL;
        return err;
    }
    return 0;
}

int td__mg_file_write(mg_file_t *mf, const void *p, size_t n)
{
    if (n && fwrite(p, 1, n, mf->f) != n) {
        int e = errno;
        return td_err_set(e == ENOSPC ? TD_ENOSPC : TD_EIO, "%s: write: %s", mf->path, strerror(e));
    }
    return 0;
}

int td__mg_file_pad(mg_file_t *mf, size_t n)
{
    static const uint8_t zeros[64];
    TD_ASSERT(n <= sizeof(zeros));
    return td__mg_file_write(mf, zeros, n);
}

int td__mg_file_close(mg_file_t *mf, int err)
{
    if (mf->f) {
        if (fclose(mf->f) != 0 && err == 0) {
            int e = errno;
            err = td_err_set(td_err_from_errno(e), "%s: close: %s", mf->path, strerror(e));
        }
        if (err)
            remove(mf->path);
    }
    free(mf->path);
    mf->f = NULL;
    mf->path = NULL;
    return err;
}

int td__mg_write_text(const char *dir, const char *name, const td_buf_t *b)
{
    mg_file_t mf = {0};
    int err = td__mg_file_open(&mf, dir, name);
    if (err)
        return err;
    err = td__mg_file_write(&mf, b->data, b->len);
    return td__mg_file_close(&mf, err);
}

/* Remove dir/name if it exists, so that a rewritten directory holds no stale weight files that a
 * loader would prefer (an index next to a single file). */
void td__mg_remove_stale(const char *dir, const char *name)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) < sizeof(path))
        (void)unlink(path);
}

/* ------------------------------------------------------------------------------------------ */
/* Entry points                                                                                */
/* ------------------------------------------------------------------------------------------ */

int td_modelgen_parse_arch(const char *s, td_modelgen_arch_t *out)
{
    static const char *names[] = {"llama", "qwen3", "deepseek_v2", "deepseek_v3"};
    for (size_t i = 0; s && i < TD_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (td_modelgen_arch_t)i;
            return 0;
        }
    return td_err_set(TD_EINVAL,
                      "unknown architecture \"%s\" (llama, qwen3, deepseek_v2, "
                      "deepseek_v3)",
                      s ? s : "");
}

int td_modelgen_parse_preset(const char *s, td_modelgen_preset_t *out)
{
    if (td_str_eq(s, "tiny"))
        *out = TD_MODELGEN_TINY;
    else if (td_str_eq(s, "bench"))
        *out = TD_MODELGEN_BENCH;
    else if (td_str_eq(s, "llama8b"))
        *out = TD_MODELGEN_LLAMA8B;
    else if (td_str_eq(s, "dsv2lite"))
        *out = TD_MODELGEN_DSV2LITE;
    else if (td_str_eq(s, "small"))
        *out = TD_MODELGEN_SMALL;
    else
        return td_err_set(TD_EINVAL,
                          "unknown preset \"%s\" (tiny, bench, llama8b, dsv2lite, small)",
                          s ? s : "");
    return 0;
}

int td_modelgen_parse_dtype(const char *s, td_modelgen_dtype_t *out)
{
    static const char *names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q6_k", "q4_k_m"};
    for (size_t i = 0; s && i < TD_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i]) == 0) {
            *out = (td_modelgen_dtype_t)i;
            return 0;
        }
    return td_err_set(TD_EINVAL,
                      "unknown dtype \"%s\" (f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m)",
                      s ? s : "");
}

/* Write `len` bytes of `data` as to_dir/name. */
static int copy_file(const char *to_dir, const char *name, const char *data, size_t len)
{
    td_buf_t b = {(char *)data, len, len + 1};
    return td__mg_write_text(to_dir, name, &b);
}

int td_modelgen_write(const td_modelgen_opts_t *o, td_modelgen_info_t *info)
{
    mg_ctx_t c;
    mg_tok_t tok;
    int err, n_files = 0;
    memset(&c, 0, sizeof(c));
    memset(&tok, 0, sizeof(tok));
    c.o = o;
    if (!o->out_dir || !*o->out_dir)
        return td_err_set(TD_EINVAL, "mkmodel: no output directory");
    if ((unsigned)o->arch > TD_MODELGEN_DEEPSEEK_V3)
        return td_err_set(TD_EINVAL, "mkmodel: unknown architecture %d", (int)o->arch);
    if (o->dtype >= TD_MODELGEN_Q8_0)
        return td_err_set(TD_EINVAL, "mkmodel: --dtype %s is for GGUF only (use --gguf)",
                          o->dtype == TD_MODELGEN_Q8_0 ? "q8_0" : "of a quantised type");
    if (o->fp8 && !td__mg_is_deepseek(o->arch))
        return td_err_set(TD_EINVAL, "mkmodel: --fp8 is for the DeepSeek architectures");
    if (o->fp8 && o->fused_experts)
        return td_err_set(TD_EINVAL, "mkmodel: --fp8 with --fused-experts is not supported");
    if (o->fused_experts && !td__mg_is_deepseek(o->arch))
        return td_err_set(TD_EINVAL, "mkmodel: --fused-experts needs an MoE architecture");
    if (o->gguf && o->arch == TD_MODELGEN_QWEN3)
        return td_err_set(TD_EINVAL, "mkmodel: --gguf supports llama, deepseek_v2, deepseek_v3");
    if (o->gguf && o->gguf_dtype == TD_MODELGEN_BF16)
        return td_err_set(TD_EINVAL,
                          "mkmodel: --gguf type must be f32, f16, q8_0, q4_0, q4_k, q6_k or q4_k_m");
    if (o->shards < 0 || o->shards > 99)
        return td_err_set(TD_EINVAL, "mkmodel: --shards must be 1..99");
    if (o->preset == TD_MODELGEN_LLAMA8B && o->arch != TD_MODELGEN_LLAMA)
        return td_err_set(TD_EINVAL, "mkmodel: --preset llama8b is for --arch llama");
    if (o->preset == TD_MODELGEN_DSV2LITE && o->arch != TD_MODELGEN_DEEPSEEK_V2)
        return td_err_set(TD_EINVAL, "mkmodel: --preset dsv2lite is for --arch deepseek_v2");
    if (o->layers < 0 || o->layers > 1024)
        return td_err_set(TD_EINVAL, "mkmodel: --layers must be 1..1024");
    td__mg_hp_init(&c.hp, o->arch, o->preset);
    if (o->layers > 0) {
        c.hp.n_layers = o->layers;
        c.hp.first_dense = TD_MIN(c.hp.first_dense, o->layers);
    }
    if (o->context < 0 || o->context > (1 << 20))
        return td_err_set(TD_EINVAL, "mkmodel: --context must be 1..1048576");
    if (o->context > 0 && td__mg_is_deepseek(o->arch)) {
        c.hp.yarn_factor = TD_MAX(1.0, (double)o->context / c.hp.yarn_orig);
        c.hp.max_pos = o->context;
    } else if (o->context > 0) {
        c.hp.max_pos = o->context;
    }
    c.use_fp8 = o->fp8;
    if (o->tokenizer_dir) {
        err = td__mg_tok_load(&tok, o->tokenizer_dir);
        if (err)
            return err;
        c.hp.vocab = tok.vocab;
    } else {
        err = td__mg_tok_synthetic(&tok, c.hp.vocab);
        if (err)
            return err;
    }
    if (mkdir(o->out_dir, 0755) != 0 && errno != EEXIST) {
        int e = errno;
        err = td_err_set(td_err_from_errno(e), "%s: mkdir: %s", o->out_dir, strerror(e));
        goto out;
    }
    err = td__mg_build_list(&c.hp, o->arch, &c.list);
    if (!err)
        err = td__mg_write_config(&c, &tok);
    if (!err)
        err = td__mg_write_safetensors(&c, &n_files);
    if (!err && o->tokenizer_dir) {
        err = copy_file(o->out_dir, "tokenizer.json", tok.json, tok.json_len);
        if (!err)
            err = copy_file(o->out_dir, "tokenizer_config.json", tok.cfg_json, tok.cfg_len);
    }
    if (!err && o->gguf)
        err = td__mg_write_gguf(&c, &tok);
    if (!err && info) {
        info->n_params = 0;
        for (int i = 0; i < c.list.n; i++)
            info->n_params += td__mg_numel(&c.list.t[i]);
        info->vocab_size = c.hp.vocab;
        info->n_files = n_files;
    }
out:
    free(c.list.t);
    td__mg_tok_free(&tok);
    return err;
}
