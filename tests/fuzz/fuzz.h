/* fuzz.h: the contract between a fuzz target and its drivers. Each target defines
 * LLVMFuzzerTestOneInput (so it links with libFuzzer: clang -fsanitize=fuzzer,address) and
 * fuzz_seed, a small valid input that fuzz_driver.c mutates when built without libFuzzer. */
#ifndef TD_FUZZ_H
#define TD_FUZZ_H

#include "td_util.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Append one valid input to `b`. */
void fuzz_seed(td_buf_t *b);

#endif
