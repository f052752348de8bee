/* config.c: the options both worker daemons read (td_wk_opts; docs/configuration.md lists them
 * as --help prints them). */
#include "td_config.h"
#include "td_worker.h"

#include <stddef.h>

#define O(f) offsetof(td_wk_cfg_t, f)
const td_opt_t td_wk_opts[] = {
    {"model", TD_OPT_STR, O(model), NULL, "model directory (config.json, safetensors, tokenizer)"},
    {"id", TD_OPT_STR, O(id), NULL, "worker id, unique in the cluster (default: role-host-pid)"},
    {"routers", TD_OPT_STR, O(routers), "127.0.0.1:8200",
     "comma-separated cluster addresses of every router (host:port or unix:/path)"},
    {"cluster.secret", TD_OPT_STR, O(secret), NULL,
     "shared cluster secret (prefer cluster.secret_file)"},
    {"cluster.secret_file", TD_OPT_STR, O(secret_file), NULL,
     "file holding the shared cluster secret (default: $CREDENTIALS_DIRECTORY/cluster-secret)"},
    {"http.listen", TD_OPT_STR, O(http_listen), "127.0.0.1:0",
     "address of /metrics and /health (port 0: any free port)"},
    {"kv.memory", TD_OPT_SIZE, O(kv_memory), "256M", "KV pool size when kv.blocks is 0", 0, 0},
    {"kv.blocks", TD_OPT_UINT, O(kv_blocks), "0", "KV pool size in blocks (0: from kv.memory)", 0,
     1 << 30},
    {"kv.block_size", TD_OPT_INT, O(block_size), "16",
     "tokens per KV block; the same on every worker of a cluster", 1, 4096},
    {"kv.checksum", TD_OPT_BOOL, O(kv_checksum), "false",
     "verify a per-block XXH3 checksum on every KV transfer"},
    {"kv.prefix_cache", TD_OPT_BOOL, O(prefix_cache), "true",
     "keep the full blocks of finished sequences and reuse them for prompts that start alike"},
    {"kv.disk_dir", TD_OPT_STR, O(disk_dir), NULL,
     "directory of the disk tier of the KV cache, kept across restarts (unset: no disk tier)"},
    {"kv.disk_max", TD_OPT_SIZE, O(disk_max), "10G", "size cap of the disk tier", 1, 0},
    {"kv.disk_load", TD_OPT_STR, O(disk_load), "auto",
     "auto: load cached blocks from disk when measured cheaper than computing them; always"},
    {"kv.wait_s", TD_OPT_DOUBLE, O(kv_wait_s), "60",
     "decode: seconds reserved blocks wait for the prefill worker's KV", 0.1, 3600},
    {"kv.redis", TD_OPT_STR, O(kv_redis), "",
     "host:port of the Redis that holds the cluster KV index (the routers read it to send a "
     "prompt where its prefix is cached); empty: not published"},
    {"kv.redis_lease_s", TD_OPT_DOUBLE, O(kv_redis_lease_s), "10",
     "seconds the worker's index entries outlive its last heartbeat (a dead worker's go by "
     "themselves)", 0.1, 3600},
    {"kv.fetch_timeout_s", TD_OPT_DOUBLE, O(fetch_timeout_s), "2",
     "prefill: seconds a prompt waits for KV blocks fetched from another worker (the router's "
     "fetch hint) before it computes them", 0.01, 600},
    {"engine.threads", TD_OPT_INT, O(threads), "0", "compute threads (0: every core)", 0, 1024},
    {"engine.hugepage_weights", TD_OPT_BOOL, O(hugepage_weights), "false",
     "cpu engine: copy the weights at start into anonymous memory on transparent huge pages, "
     "which decode streams a few percent faster than the file's page cache (BENCHMARKS.md); "
     "the copy is private to the process, not shared with others mapping the same model; F16 "
     "matrices are read from engine.grouped_weights' copy instead, where that is on"},
    {"engine.grouped_weights", TD_OPT_BOOL, O(grouped_weights), "true",
     "cpu engine: multiply F16 weight matrices from a copy made at start with their rows in groups "
     "of three, which one token's kernel reads as one stream (faster decode: BENCHMARKS.md); the "
     "copy takes the F16 matrices' size again in anonymous memory (false: read them where they "
     "are stored)"},
    {"engine.max_batch_tokens", TD_OPT_INT, O(max_batch_tokens), "2048",
     "tokens per step, decodes and prefill chunks together", 1, 1 << 20},
    {"engine.prefill_chunk", TD_OPT_INT, O(prefill_chunk), "512",
     "largest prefill chunk of one prompt per step", 1, 1 << 20},
    {"engine.max_running", TD_OPT_INT, O(max_running), "256",
     "sequences held at once (running, prefilling and waiting for KV)", 1, 1 << 20},
    {"engine.kind", TD_OPT_STR, O(engine_kind), "cpu",
     "cpu: run the model; sim: SIMULATED engine: no model math, each step takes the time of "
     "the sim.* latency model (batching, KV reservation and transfer stay real)"},
    {"sim.step_us", TD_OPT_DOUBLE, O(sim.step_us), "2000",
     "simulated engine: fixed microseconds per step", 0, 1e9},
    {"sim.prefill_us_per_token", TD_OPT_DOUBLE, O(sim.prefill_us_per_token), "50",
     "simulated engine: microseconds per prompt token in a step", 0, 1e9},
    {"sim.decode_us_per_seq", TD_OPT_DOUBLE, O(sim.decode_us_per_seq), "100",
     "simulated engine: microseconds per decoding sequence in a step", 0, 1e9},
    {"sim.decode_us_per_ctx_token", TD_OPT_DOUBLE, O(sim.decode_us_per_ctx_token), "0.05",
     "simulated engine: microseconds per cached token a decoding sequence attends to", 0, 1e9},
    {"heartbeat_s", TD_OPT_DOUBLE, O(heartbeat_s), "0.5", "seconds between heartbeats", 0.01, 60},
    {"drain_timeout_s", TD_OPT_DOUBLE, O(drain_timeout_s), "10",
     "on SIGTERM: seconds to finish running requests before canceling them", 0, 3600},
    {"metrics.vllm_names", TD_OPT_BOOL, O(vllm_names), "false",
     "/metrics: export KV usage, preemptions and the pool's prefix-cache counters under vLLM's "
     "names (vllm:, model_name label)"},
    {"metrics.model_name", TD_OPT_STR, O(model_name), NULL,
     "model_name label with metrics.vllm_names: the router's served_model_name (default: the "
     "model directory's basename, as the router's)"},
    {"log.level", TD_OPT_STR, O(log_level), "info", "error|warn|info|debug|trace"},
    {"log.format", TD_OPT_STR, O(log_format), "logfmt", "logfmt|json"},
};
#undef O
const size_t td_wk_n_opts = sizeof(td_wk_opts) / sizeof(td_wk_opts[0]);
