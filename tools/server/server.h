// `lamina serve`: an OpenAI- and llama-server-compatible HTTP server over serve::Scheduler.
// The flags are llama-server's spellings; the routes, fields and error shapes follow
// llama.cpp's tools/server/README.md. HTTP threads parse JSON into typed requests and read
// events back; only the scheduler's engine thread touches the model.
#pragma once

#include <string>
#include <vector>

#include "../cli_commands.h"
#include "web_files.h"  // the web page at "/" and its files

namespace lamina::cli {

struct ServeOptions {
  std::string model_path;  // empty: the shipped model
  std::string host = "127.0.0.1";
  int port = 8080;
  int n_ctx = 0;  // total cells over all slots (0: 4096 per slot, capped by training)
  int n_parallel = 1;
  // --kv-unified: every slot may use all n_ctx cells, the slots sharing them (0: 4096 for all)
  bool kv_unified = false;
  int n_predict = -1;  // default per request (-1: until a stop rule or the slot is full)
  int n_threads = 0;
  int n_threads_http = 0;  // 0: enough for 64 connections
  int n_batch = 512;
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  long long seed = -1;                // default seed of every request; -1: a random one per request
  std::string alias;                  // comma list; the first is the model id
  std::string tags;                   // comma list
  std::vector<std::string> api_keys;  // --api-key (repeatable; each may be a comma list)
  std::string api_key_file;
  // --cors-origin: origins whose pages may read answers (comma list; "*": any, without
  // credentials); empty: no cross-origin reads.
  std::string cors_origins;
  // --host-allow: names the Host header may carry (comma list; "*": any); empty: the loopback
  // names when bound to a loopback address (a guard against DNS rebinding), else any.
  std::string allowed_hosts;
  int max_connections = 1024;  // --max-connections
  int n_keep = 0;              // --keep: the default n_keep of a request
  bool slots = true;
  std::string slot_save_path;
  bool context_shift = false;
  bool ui = true;
  // --ui-mcp-proxy: llama-server's /cors-proxy, which fetches any URL a client names (off: 403).
  bool ui_mcp_proxy = false;
  bool verbose = false;
  std::string chat_template;       // --chat-template: a built-in name or a Jinja source
  std::string chat_template_file;  // --chat-template-file: a Jinja source file
  bool jinja = false;              // --jinja: the model's template through the Jinja engine
  bool prefill_assistant = true;   // off: --no-prefill-assistant
  // Reasoning (docs/SERVER.md, "Reasoning"): --reasoning-format none|deepseek|deepseek-legacy|
  // auto, -rea/--reasoning on|off|auto (the templates' enable_thinking; auto: on unless the
  // budget is 0), --reasoning-budget N (-1: none; 0: thinking off), --reasoning-budget-message,
  // --chat-template-kwargs JSON (more template variables for every request).
  std::string reasoning_format = "auto";
  std::string reasoning = "auto";
  int reasoning_budget = -1;
  std::string reasoning_budget_message;
  std::string chat_template_kwargs;
  // The default grammar of every request (a request's own grammar, json_schema or
  // response_format replaces it): --grammar / --grammar-file / -j,--json-schema /
  // -jf,--json-schema-file, as `lamina run` takes them.
  std::string grammar;
  std::string grammar_file;
  std::string json_schema;
  std::string json_schema_file;
  std::string kv = "f16";
  std::string kv_v_round = "rtn";
  int kv_window = -1;       // --kv-window; -1: the mode's default
  bool swa_full = false;    // --swa-full: every cell of sliding-window layers, not a ring
  int recurrent_ring = 32;  // --recurrent-ring (hybrid models; kRecurrentRingDefault)
  std::string
      mem_limit;  // --mem-limit SIZE|none; empty: LAMINA_MEM_LIMIT, else 90% of MemAvailable
  unsigned long long kv_seed = 0;
  size_t max_body_bytes = 8u << 20;
  SpecCliOptions spec;        // speculative decoding in every slot (-md, --spec, --draft-max, ...)
  SamplerChainOptions chain;  // --presence-penalty, --mirostat, --dry-*, --samplers, ...: defaults
};

// Parses argv (after the "serve" word) the way llama-server spells its flags and runs the server
// until SIGTERM/SIGINT. Returns a process exit code (2 for bad usage, 3 for a bad model file).
int RunServeCommand(int argc, char** argv);

}  // namespace lamina::cli
