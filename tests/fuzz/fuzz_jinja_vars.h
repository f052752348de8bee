/* fuzz_jinja_vars.h: the fixed conversation fuzz_jinja.c and jinja_diff.c render templates
 * against (system, user, an assistant tool call, a tool result, a tool, the usual flags). */
#ifndef TD_FUZZ_JINJA_VARS_H
#define TD_FUZZ_JINJA_VARS_H

static const char fuzz_jinja_vars[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
    " {\"role\": \"user\", \"content\": \"Weather in Paris?\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\","
    "  \"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "  \"arguments\": {\"city\": \"Paris\", \"n\": 1.5}}}]},"
    " {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"{\\\"t\\\": 18}\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\","
    "  \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}],"
    " \"documents\": null, \"add_generation_prompt\": true, \"enable_thinking\": false,"
    " \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

#define FUZZ_JINJA_LIMITS                                                                          \
    {.max_output = 1 << 16, .max_memory = 16 << 20, .max_steps = 20000, .max_depth = 20}

#endif
