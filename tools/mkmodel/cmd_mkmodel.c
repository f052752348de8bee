/* cmd_mkmodel.c: `tandem mkmodel`: write a deterministic random-weight model for tests and
 * benchmarks (see td_modelgen.h). */
#include "cli.h"
#include "td_error.h"
#include "td_modelgen.h"
#include "td_util.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void mkmodel_usage(FILE *out)
{
    fprintf(out,
            "usage: tandem mkmodel --arch ARCH --out DIR [options]\n"
            "\n"
            "Writes a deterministic random-weight model in Hugging Face layout (config.json,\n"
            "safetensors) and optionally the same weights as GGUF v3.\n"
            "\n"
            "  --arch ARCH         llama | qwen3 | deepseek_v2 | deepseek_v3\n"
            "  --out DIR           output directory (created; its parent must exist)\n"
            "  --preset NAME       tiny (hidden 64, 2-3 layers; default) | bench (~100M params)\n"
            "                      | llama8b (llama: Llama 3.1 8B's shapes)\n"
            "                      | dsv2lite (deepseek_v2: DeepSeek-V2-Lite's shapes)\n"
            "                      | small (tiny with hidden 256: rows for the K-quants)\n"
            "  --layers N          N layers instead of the preset's\n"
            "  --seed N            weight seed (default 1); same seed, same bytes\n"
            "  --dtype T           safetensors dtype: f32 (default) | bf16 | f16\n"
            "  --fp8               DeepSeek: linear weights as F8_E4M3 + 128x128 weight_scale_inv\n"
            "  --shards N          split into N files with model.safetensors.index.json\n"
            "  --context N         max_position_embeddings (default: the preset's)\n"
            "  --fused-experts     experts as experts.gate_up_proj / experts.down_proj\n"
            "  --tokenizer DIR     copy DIR/tokenizer.json and tokenizer_config.json; the\n"
            "                      vocabulary size becomes the tokenizer's (default: 512 ids,\n"
            "                      32000 for bench, no tokenizer files)\n"
            "  --gguf T            also write model.gguf with matrices in f32 | f16 | q8_0 |\n"
            "                      q4_0 | q4_k | q6_k | q4_k_m (ggml's reference quantizers;\n"
            "                      rows too short for a block format take a smaller one)\n"
            "                      (llama, deepseek_v2, deepseek_v3)\n");
}

int td_cmd_mkmodel(int argc, char **argv)
{
    enum {
        O_ARCH = 256,
        O_OUT,
        O_PRESET,
        O_SEED,
        O_DTYPE,
        O_FP8,
        O_SHARDS,
        O_FUSED,
        O_TOK,
        O_CTX,
        O_GGUF,
        O_LAYERS
    };
    static const struct option opts[] = {
        {"arch", required_argument, NULL, O_ARCH},
        {"out", required_argument, NULL, O_OUT},
        {"preset", required_argument, NULL, O_PRESET},
        {"seed", required_argument, NULL, O_SEED},
        {"dtype", required_argument, NULL, O_DTYPE},
        {"fp8", no_argument, NULL, O_FP8},
        {"shards", required_argument, NULL, O_SHARDS},
        {"fused-experts", no_argument, NULL, O_FUSED},
        {"tokenizer", required_argument, NULL, O_TOK},
        {"context", required_argument, NULL, O_CTX},
        {"gguf", required_argument, NULL, O_GGUF},
        {"layers", required_argument, NULL, O_LAYERS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    td_modelgen_opts_t o;
    memset(&o, 0, sizeof(o));
    o.seed = 1;
    o.shards = 1;
    bool have_arch = false;
    int c, err = 0;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        int64_t n;
        switch (c) {
        case O_ARCH:
            err = td_modelgen_parse_arch(optarg, &o.arch);
            have_arch = true;
            break;
        case O_OUT:
            o.out_dir = optarg;
            break;
        case O_PRESET:
            err = td_modelgen_parse_preset(optarg, &o.preset);
            break;
        case O_SEED:
            err = td_parse_u64(optarg, &o.seed);
            if (err)
                err = td_err_set(err, "--seed: \"%s\" is not an unsigned integer", optarg);
            break;
        case O_DTYPE:
            err = td_modelgen_parse_dtype(optarg, &o.dtype);
            break;
        case O_FP8:
            o.fp8 = true;
            break;
        case O_SHARDS:
            err = td_parse_i64(optarg, &n);
            if (err || n < 1 || n > 99)
                err =
                    td_err_set(TD_EINVAL, "--shards: \"%s\" is not a number from 1 to 99", optarg);
            else
                o.shards = (int)n;
            break;
        case O_FUSED:
            o.fused_experts = true;
            break;
        case O_TOK:
            o.tokenizer_dir = optarg;
            break;
        case O_CTX: {
            int64_t ctx;
            if (td_parse_i64(optarg, &ctx) != 0 || ctx < 1 || ctx > (1 << 20))
                err = td_err_set(TD_EINVAL, "--context: \"%s\" is not a number from 1 to 1048576",
                                 optarg);
            else
                o.context = (int)ctx;
            break;
        }
        case O_LAYERS:
            if (td_parse_i64(optarg, &n) != 0 || n < 1 || n > 1024)
                err = td_err_set(TD_EINVAL, "--layers: \"%s\" is not a number from 1 to 1024",
                                 optarg);
            else
                o.layers = (int)n;
            break;
        case O_GGUF:
            o.gguf = true;
            err = td_modelgen_parse_dtype(optarg, &o.gguf_dtype);
            break;
        case 'h':
            mkmodel_usage(stdout);
            return 0;
        default:
            mkmodel_usage(stderr);
            return 2;
        }
        if (err) {
            fprintf(stderr, "tandem mkmodel: %s\n", td_err_msg());
            return 2;
        }
    }
    if (optind < argc || !have_arch || !o.out_dir) {
        fprintf(stderr, "tandem mkmodel: %s\n\n",
                optind < argc ? "unexpected argument" : "--arch and --out are required");
        mkmodel_usage(stderr);
        return 2;
    }
    td_modelgen_info_t info;
    err = td_modelgen_write(&o, &info);
    if (err) {
        fprintf(stderr, "tandem mkmodel: %s\n", td_err_msg());
        return 1;
    }
    printf("wrote %s: %lld parameters, vocabulary %d, %d safetensors file%s%s\n", o.out_dir,
           (long long)info.n_params, info.vocab_size, info.n_files, info.n_files == 1 ? "" : "s",
           o.gguf ? ", model.gguf" : "");
    return 0;
}
