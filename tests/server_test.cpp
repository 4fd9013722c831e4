// `lamina serve` as a real process on a free loopback port, driven over plain HTTP: every native
// llama-server route, the error shapes, slots and slot files, context limits and shift, token
// counts and greedy tokens equal to llama.cpp's on stories260K, batch invariance (8 concurrent
// requests = each alone, in every KV mode, at two batch sizes), a load of 64 clients with
// cancellations and oversize bodies, and tool calling (forced calls, every parsed format).
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <thread>

#include "route_parts.h"

namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::string kBinary = LAMINA_BINARY;
const std::string kShipped = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
const std::string kShared = LAMINA_SHARED_DIR;

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

// A `lamina serve` child process; stopped with SIGTERM on destruction.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args, int port = 0)
      : port_(port > 0 ? port : FreePort()) {
    log_ = fs::temp_directory_path() /
           ("lamina-serve-" + std::to_string(::getpid()) + "-" + std::to_string(port_) + ".log");
    args.insert(args.begin(), {kBinary, "serve", "--port", std::to_string(port_)});
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      dup2(fd, 1);
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    for (int i = 0; i < 1200 && !healthy_; ++i) {
      httplib::Client c("127.0.0.1", port_);
      auto r = c.Get("/health");
      healthy_ = r && r->status == 200;
      if (!healthy_) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
  }
  ~ServerProcess() {
    Stop();
    // The log stays behind only when a test failed (its messages point at it).
    if (!testing::Test::HasFailure()) std::filesystem::remove(log_);
  }
  // SIGTERM; returns the exit status (-1 if it had to be killed).
  int Stop() {
    if (pid_ <= 0) return exit_code_;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 500; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = 0;
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        return exit_code_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = 0;
    return exit_code_ = -1;
  }
  bool healthy() const { return healthy_; }
  int port() const { return port_; }
  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  httplib::Client Client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }
  // POST a JSON body; the response's status and parsed body.
  std::pair<int, json> Post(const std::string& path, const json& body,
                            const httplib::Headers& headers = {}) const {
    httplib::Client c = Client();
    auto r = c.Post(path.c_str(), headers, body.dump(), "application/json");
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }
  std::pair<int, json> Get(const std::string& path) const {
    httplib::Client c = Client();
    auto r = c.Get(path.c_str());
    if (!r) return {0, json()};
    return {r->status, json::parse(r->body, nullptr, false)};
  }

 private:
  int port_;
  pid_t pid_ = 0;
  bool healthy_ = false;
  int exit_code_ = -1;
  fs::path log_;
};

std::string Count(int n) {
  std::string s;
  for (int i = 1; i <= n; ++i) s += (i > 1 ? "\n" : "") + std::to_string(i);
  return s;
}

std::string ChatPrompt(const std::string& user) {
  return "<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n";
}

// The `data: {...}` events of an SSE body, parsed.
std::vector<json> SseEvents(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    const std::string payload = body.substr(pos + 6, end - pos - 6);
    if (payload != "[DONE]") out.push_back(json::parse(payload, nullptr, false));
    pos = end;
  }
  return out;
}

// A streamed /completion's content and final event.
std::pair<std::string, json> StreamCompletion(const ServerProcess& s, json body) {
  body["stream"] = true;
  httplib::Client c = s.Client();
  auto r = c.Post("/completion", body.dump(), "application/json");
  if (!r || r->status != 200) return {"", json()};
  std::string text;
  json last;
  for (const json& e : SseEvents(r->body)) {
    text += e.value("content", "");
    last = e;
  }
  return {text, last};
}

class ServerTest : public testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kShipped)) GTEST_SKIP() << kShipped << " is absent";
  }
};

TEST_F(ServerTest, NativeCompletionRoute) {
  ServerProcess s({"-m", kShipped, "-np", "2", "-c", "2048"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  EXPECT_EQ(s.Get("/health").second, json({{"status", "ok"}}));
  const std::string prompt = ChatPrompt("Count from 1 to 8, one number per line.");
  auto [st, r] =
      s.Post("/completion",
             {{"prompt", prompt}, {"n_predict", 100}, {"temperature", 0}, {"return_tokens", true}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["content"], Count(8));
  EXPECT_EQ(r["stop"], true);
  EXPECT_EQ(r["stop_type"], "eos");
  EXPECT_EQ(r["truncated"], false);
  EXPECT_EQ(r["generation_settings"]["n_ctx"], 1024);
  const int n_prompt = r["tokens_evaluated"];
  auto [tst, tok] = s.Post("/tokenize", {{"content", prompt}, {"add_special", true}});
  ASSERT_EQ(tst, 200);
  EXPECT_EQ(static_cast<int>(tok["tokens"].size()), n_prompt);
  EXPECT_EQ(r["tokens_predicted"], r["tokens"].size());
  EXPECT_EQ(r["timings"]["prompt_n"].get<int>() + r["timings"]["cache_n"].get<int>(), n_prompt);
  EXPECT_GT(r["timings"]["predicted_per_second"].get<double>(), 0.0);
  auto [dst, detok] = s.Post("/detokenize", {{"tokens", r["tokens"]}});
  EXPECT_EQ(detok["content"], Count(8));

  // Token ids, and a mix of text and ids, give the same answer.
  auto [ist, by_ids] =
      s.Post("/completion", {{"prompt", tok["tokens"]}, {"n_predict", 100}, {"temperature", 0}});
  EXPECT_EQ(by_ids["content"], Count(8));
  // Text up to a special token, then ids.
  const size_t split = prompt.find("<|im_start|>assistant");
  json mixed = json::array({prompt.substr(0, split)});
  auto [m1, rest_ids] = s.Post("/tokenize", {{"content", prompt.substr(split)}});
  for (const json& id : rest_ids["tokens"]) mixed.push_back(id);
  auto [mst, by_mix] =
      s.Post("/completion", {{"prompt", mixed}, {"n_predict", 100}, {"temperature", 0}});
  ASSERT_EQ(mst, 200) << by_mix.dump();
  EXPECT_EQ(by_mix["tokens_evaluated"], n_prompt);
  EXPECT_EQ(by_mix["content"], Count(8));
  // An array of prompts answers with an array.
  auto [ast, many] = s.Post(
      "/completion", {{"prompt", {prompt, ChatPrompt("Count from 1 to 3, one number per line.")}},
                      {"n_predict", 100},
                      {"temperature", 0}});
  ASSERT_EQ(ast, 200);
  ASSERT_TRUE(many.is_array());
  ASSERT_EQ(many.size(), 2u);
  EXPECT_EQ(many[0]["content"], Count(8));
  EXPECT_EQ(many[1]["content"], Count(3));
  EXPECT_EQ(many[1]["index"], 1);
  // Streaming: the pieces add up to the same text; the last event has stop and the totals.
  auto [text, last] =
      StreamCompletion(s, {{"prompt", prompt}, {"n_predict", 100}, {"temperature", 0}});
  EXPECT_EQ(text, Count(8));
  EXPECT_EQ(last["stop"], true);
  EXPECT_EQ(last["stop_type"], "eos");
  EXPECT_EQ(last["tokens_predicted"], r["tokens_predicted"]);
  // n_predict, a stop word, id_slot, cache_prompt.
  auto [nst, limited] = s.Post(
      "/completion", {{"prompt", prompt}, {"n_predict", 3}, {"temperature", 0}, {"id_slot", 1}});
  EXPECT_EQ(limited["stop_type"], "limit");
  EXPECT_EQ(limited["tokens_predicted"], 3);
  EXPECT_EQ(limited["id_slot"], 1);
  auto [wst, word] =
      s.Post("/completion", {{"prompt", prompt}, {"stop", {"\n4"}}, {"temperature", 0}});
  EXPECT_EQ(word["content"], Count(3));
  EXPECT_EQ(word["stop_type"], "word");
  EXPECT_EQ(word["stopping_word"], "\n4");
  auto [cst, cold] =
      s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}, {"cache_prompt", false}});
  EXPECT_EQ(cold["timings"]["cache_n"], 0);
  EXPECT_EQ(cold["content"], Count(8));
  auto [wst2, warm] =
      s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}, {"id_slot", 0}});
  EXPECT_EQ(warm["timings"]["cache_n"], n_prompt - 1);
  EXPECT_EQ(warm["content"], Count(8));
  auto [ost, oai] = s.Post("/v1/completions", {{"prompt", prompt}, {"temperature", 0}});
  EXPECT_EQ(oai["choices"][0]["text"], Count(8));
  EXPECT_EQ(oai["object"], "text_completion");
  EXPECT_EQ(s.Stop(), 0) << s.Log();
}

TEST_F(ServerTest, TokenizePropsSlotsAndSlotFiles) {
  const fs::path dir = fs::temp_directory_path() / ("lamina-slots-" + std::to_string(getpid()));
  fs::create_directories(dir);
  ServerProcess s(
      {"-m", kShipped, "-np", "2", "-c", "1024", "--seed", "42", "--slot-save-path", dir.string()});
  ASSERT_TRUE(s.healthy()) << s.Log();
  auto [tst, tok] = s.Post("/tokenize", {{"content", "Count 12"}, {"with_pieces", true}});
  ASSERT_EQ(tst, 200);
  ASSERT_FALSE(tok["tokens"].empty());
  std::string joined;
  for (const json& t : tok["tokens"]) {
    ASSERT_TRUE(t.contains("id") && t.contains("piece"));
    joined += t["piece"].get<std::string>();
  }
  EXPECT_EQ(joined, "Count 12");
  auto [pst, props] = s.Get("/props");
  EXPECT_EQ(props["total_slots"], 2);
  EXPECT_EQ(props["default_generation_settings"]["n_ctx"], 512);
  EXPECT_EQ(props["default_generation_settings"]["params"]["seed"], 42);
  EXPECT_NE(props["model_path"].get<std::string>().find("lamina-counter"), std::string::npos);
  auto [sst, slots] = s.Get("/slots");
  ASSERT_EQ(sst, 200);
  ASSERT_EQ(slots.size(), 2u);
  EXPECT_EQ(slots[1]["id"], 1);
  EXPECT_EQ(slots[1]["n_ctx"], 512);

  const std::string prompt = ChatPrompt("Count from 1 to 6, one number per line.");
  const json req = {{"prompt", prompt}, {"temperature", 0}, {"id_slot", 0}};
  auto [r1s, first] = s.Post("/completion", req);
  ASSERT_EQ(first["content"], Count(6));
  auto [svs, saved] = s.Post("/slots/0?action=save", {{"filename", "a.bin"}});
  ASSERT_EQ(svs, 200) << saved.dump();
  const int held = saved["n_saved"];
  EXPECT_GT(held, first["tokens_evaluated"].get<int>());
  auto [ers, erased] = s.Post("/slots/0?action=erase", json::object());
  EXPECT_EQ(erased["n_erased"], held);
  auto [rss, restored] = s.Post("/slots/0?action=restore", {{"filename", "a.bin"}});
  ASSERT_EQ(rss, 200) << restored.dump();
  EXPECT_EQ(restored["n_restored"], held);
  auto [r2s, again] = s.Post("/completion", req);
  EXPECT_EQ(again["content"], Count(6));
  EXPECT_EQ(again["timings"]["cache_n"], first["tokens_evaluated"].get<int>() - 1);
  auto [bad, badname] = s.Post("/slots/0?action=save", {{"filename", "../x"}});
  EXPECT_EQ(bad, 400);
  auto [missing, nofile] = s.Post("/slots/1?action=restore", {{"filename", "absent.bin"}});
  EXPECT_EQ(missing, 400);
  fs::remove_all(dir);
}

// Slot files hold the session-file format: the encoded cells come back as they were (here
// q4_0 with stochastic V rounding), so a sampled completion after save → erase → restore equals
// the one right after the first request, in the same slot and in another; damaged files and a
// file of another KV mode are refused with the reason and leave the slot as it was.
TEST_F(ServerTest, SlotFilesRestoreEncodedCellsAndRefuseDamagedOnes) {
  const fs::path dir = fs::temp_directory_path() / ("lamina-slotfiles-" + std::to_string(getpid()));
  fs::create_directories(dir);
  const std::vector<std::string> common = {
      "-m",         kShipped,           "-np",       "2", "-c", "1024", "--kv-v-round",
      "stochastic", "--slot-save-path", dir.string()};
  std::vector<std::string> args = common;
  args.insert(args.end(), {"--kv", "q4_0"});
  ServerProcess s(args);
  ASSERT_TRUE(s.healthy()) << s.Log();
  const std::string prompt = ChatPrompt("Count from 1 to 6, one number per line.");
  auto [r1s, first] =
      s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}, {"id_slot", 0}});
  ASSERT_EQ(r1s, 200) << first.dump();
  auto [svs, saved] = s.Post("/slots/0?action=save", {{"filename", "s.bin"}});
  ASSERT_EQ(svs, 200) << saved.dump();
  const int held = saved["n_saved"];
  const std::string bytes = [&] {
    std::ifstream in(dir / "s.bin", std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  ASSERT_EQ(bytes.substr(0, 8), std::string("LAMSESS\0", 8));
  EXPECT_EQ(saved["n_written"], bytes.size());

  // The follow-up turn, sampled: what the slot answers right after the first request.
  const std::string follow = prompt + first["content"].get<std::string>() + "<|im_end|>\n" +
                             ChatPrompt("Count from 1 to 4, one number per line.");
  auto next = [&](int slot) {
    return s.Post("/completion", {{"prompt", follow},
                                  {"temperature", 0.9},
                                  {"seed", 7},
                                  {"n_predict", 24},
                                  {"id_slot", slot}});
  };
  auto [u_st, uninterrupted] = next(0);
  ASSERT_EQ(u_st, 200) << uninterrupted.dump();
  const int cache_n = uninterrupted["timings"]["cache_n"];
  EXPECT_GE(cache_n, held - 1);

  for (int slot : {0, 1}) {
    SCOPED_TRACE("slot " + std::to_string(slot));
    for (int e : {0, 1}) {  // both, so no slot lends the other a prefix
      auto [ers, erased] = s.Post("/slots/" + std::to_string(e) + "?action=erase", json::object());
      ASSERT_EQ(ers, 200);
    }
    auto [rss, restored] =
        s.Post("/slots/" + std::to_string(slot) + "?action=restore", {{"filename", "s.bin"}});
    ASSERT_EQ(rss, 200) << restored.dump();
    EXPECT_EQ(restored["n_restored"], held);
    EXPECT_EQ(restored["n_read"], bytes.size());
    auto [a_st, again] = next(slot);
    ASSERT_EQ(a_st, 200);
    EXPECT_EQ(again["content"], uninterrupted["content"]);
    EXPECT_EQ(again["timings"]["cache_n"], cache_n);
  }

  // Damaged files: a flipped bit in the cells, a truncation, not a session file at all.
  auto write = [&](const std::string& name, const std::string& data) {
    std::ofstream(dir / name, std::ios::binary) << data;
  };
  std::string flipped = bytes;
  flipped[flipped.size() / 2] ^= 0x10;
  write("flip.bin", flipped);
  write("short.bin", bytes.substr(0, bytes.size() - 100));
  write("junk.bin", "{\"tokens\": [1, 2, 3]}");
  // /slots is a snapshot the engine publishes after each step, which can trail the answer the
  // client already has by one step: wait until it shows slot 1 idle.
  json before;
  for (int tries = 0; tries < 100; ++tries) {
    before = s.Get("/slots").second;
    if (!before[1]["is_processing"].get<bool>()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_FALSE(before[1]["is_processing"].get<bool>());
  const int n_past = before[1]["n_past"];
  for (const auto& [name, reason] :
       std::vector<std::pair<std::string, std::string>>{{"flip.bin", "checksum mismatch"},
                                                        {"short.bin", "truncated"},
                                                        {"junk.bin", "not a lamina session file"},
                                                        {"absent.bin", "no such file"}}) {
    SCOPED_TRACE(name);
    auto [st, err] = s.Post("/slots/1?action=restore", {{"filename", name}});
    EXPECT_EQ(st, 400);
    EXPECT_NE(err["error"]["message"].get<std::string>().find(reason), std::string::npos)
        << err.dump();
  }
  auto [sl2_st, after] = s.Get("/slots");
  EXPECT_EQ(after[1]["n_past"], n_past);
  auto [k_st, kept] = next(1);
  EXPECT_EQ(kept["content"], uninterrupted["content"]);
  EXPECT_EQ(s.Stop(), 0) << s.Log();

  // Another KV mode: refused with the modes named.
  args = common;
  args.insert(args.end(), {"--kv", "int8"});
  ServerProcess other(args);
  ASSERT_TRUE(other.healthy()) << other.Log();
  auto [o_st, o_err] = other.Post("/slots/0?action=restore", {{"filename", "s.bin"}});
  EXPECT_EQ(o_st, 400);
  EXPECT_NE(o_err["error"]["message"].get<std::string>().find("made with KV mode q4_0"),
            std::string::npos)
      << o_err.dump();
  fs::remove_all(dir);
}

TEST_F(ServerTest, ErrorsAuthCorsAndUi) {
  ServerProcess s({"-m", kShipped, "--api-key", "k1", "--max-body", "65536", "--cors-origin",
                   "http://example.test"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const httplib::Headers auth = {{"Authorization", "Bearer k1"}};
  auto [nst, noauth] = s.Post("/completion", {{"prompt", "hi"}});
  EXPECT_EQ(nst, 401);
  EXPECT_EQ(noauth["error"]["type"], "authentication_error");
  EXPECT_EQ(noauth["error"]["message"], "Invalid API Key");
  auto [xst, xkey] =
      s.Post("/completion", {{"prompt", "hi"}, {"n_predict", 1}}, {{"X-Api-Key", "k1"}});
  EXPECT_EQ(xst, 200);
  EXPECT_EQ(s.Get("/health").first, 200);  // public
  EXPECT_EQ(s.Get("/v1/models").first, 200);
  httplib::Client c = s.Client();
  auto malformed = c.Post("/completion", auth, "{not json", "application/json");
  ASSERT_TRUE(malformed);
  EXPECT_EQ(malformed->status, 400);
  EXPECT_EQ(json::parse(malformed->body)["error"]["type"], "invalid_request_error");
  auto [tst, wrong_type] = s.Post("/completion", {{"prompt", "hi"}, {"n_predict", "many"}}, auth);
  EXPECT_EQ(tst, 400);
  EXPECT_NE(wrong_type["error"]["message"].get<std::string>().find("n_predict"), std::string::npos);
  auto [ist, bad_id] = s.Post("/completion", {{"prompt", {1, 999999}}}, auth);
  EXPECT_EQ(ist, 400);
  auto unknown = c.Get("/no/such/route", auth);
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
  EXPECT_EQ(json::parse(unknown->body)["error"]["type"], "not_found_error");
  auto huge = c.Post("/completion", auth, std::string(200000, ' '), "application/json");
  ASSERT_TRUE(huge);
  EXPECT_EQ(huge->status, 413);
  auto pre = c.Options("/v1/chat/completions", {{"Origin", "http://example.test"},
                                                {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(pre);
  EXPECT_LT(pre->status, 300);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://example.test");
  EXPECT_NE(pre->get_header_value("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  // An origin not on --cors-origin gets no Access-Control-Allow-Origin: its pages cannot read.
  auto foreign = c.Options("/v1/chat/completions", {{"Origin", "http://evil.test"},
                                                    {"Access-Control-Request-Method", "POST"}});
  ASSERT_TRUE(foreign);
  EXPECT_EQ(foreign->get_header_value("Access-Control-Allow-Origin"), "");
  auto foreign_get = c.Get("/health", {{"Origin", "http://evil.test"}});
  ASSERT_TRUE(foreign_get);
  EXPECT_EQ(foreign_get->get_header_value("Access-Control-Allow-Origin"), "");
  auto page = c.Get("/");
  ASSERT_TRUE(page);
  EXPECT_EQ(page->status, 200);
  EXPECT_NE(page->get_header_value("Content-Type").find("text/html"), std::string::npos);
  auto metrics = c.Get("/metrics", auth);
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("llamacpp:tokens_predicted_total"), std::string::npos);
  EXPECT_NE(metrics->body.find("lamina:kv_cache_bytes"), std::string::npos);

  ServerProcess bare({"-m", kShipped, "--no-slots", "--no-ui"});
  ASSERT_TRUE(bare.healthy()) << bare.Log();
  auto [sst, slots] = bare.Get("/slots");
  EXPECT_EQ(sst, 501);
  EXPECT_EQ(slots["error"]["type"], "not_supported_error");
  EXPECT_EQ(bare.Get("/").first, 404);
}

// llama-server's defaults where they keep the server safe: with keys and no --cors-origin every
// origin is echoed (a page still needs a key), without keys none; the web UI's files are public;
// /cors-proxy is 403 unless --ui-mcp-proxy; aliases and tags are sorted sets.
TEST_F(ServerTest, LlamaServerCorsDefaultsAssetsAndAliases) {
  const httplib::Headers preflight = {{"Origin", "http://web.example"},
                                      {"Access-Control-Request-Method", "POST"},
                                      {"Access-Control-Request-Headers", "Authorization"}};
  ServerProcess keyed({"-m", kShipped, "--api-key", "k1", "--alias", "b,c,a,b", "--tags", "y,x"});
  ASSERT_TRUE(keyed.healthy()) << keyed.Log();
  httplib::Client c = keyed.Client();
  auto pre = c.Options("/completions", preflight);
  ASSERT_TRUE(pre);
  EXPECT_EQ(pre->status, 200);
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Origin"), "http://web.example");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Credentials"), "true");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Methods"), "GET, POST");
  EXPECT_EQ(pre->get_header_value("Access-Control-Allow-Headers"), "*");
  // Echoing the origin gives a foreign page nothing beyond the public routes without the key.
  auto unkeyed = c.Post("/completion", {{"Origin", "http://web.example"}}, R"({"prompt":"1"})",
                        "application/json");
  ASSERT_TRUE(unkeyed);
  EXPECT_EQ(unkeyed->status, 401);
  EXPECT_EQ(unkeyed->get_header_value("Access-Control-Allow-Credentials"), "");
  for (const char* path : {"/sw.js", "/manifest.webmanifest", "/_app/version.json"}) {
    auto asset = c.Get(path);
    ASSERT_TRUE(asset) << path;
    EXPECT_EQ(asset->status, 200) << path;
  }
  auto [proxy_status, proxy] = keyed.Post("/cors-proxy?url=http://127.0.0.1:1/", json::object(),
                                          {{"Authorization", "Bearer k1"}});
  EXPECT_EQ(proxy_status, 403) << proxy.dump();
  auto [mst, models] = keyed.Get("/v1/models");
  ASSERT_EQ(mst, 200);
  EXPECT_EQ(models["data"][0]["id"], "a");
  EXPECT_EQ(models["data"][0]["aliases"], json({"a", "b", "c"}));
  EXPECT_EQ(models["data"][0]["tags"], json({"x", "y"}));

  ServerProcess keyless({"-m", kShipped});
  ASSERT_TRUE(keyless.healthy()) << keyless.Log();
  httplib::Client k = keyless.Client();
  auto open_pre = k.Options("/completions", preflight);
  ASSERT_TRUE(open_pre);
  EXPECT_EQ(open_pre->status, 200);
  EXPECT_EQ(open_pre->get_header_value("Access-Control-Allow-Origin"), "");
  EXPECT_EQ(open_pre->get_header_value("Access-Control-Allow-Methods"), "");
  auto [sst, slots] = keyless.Get("/slots");
  ASSERT_EQ(sst, 200);
  EXPECT_FALSE(slots[0].contains("params")) << "a slot that has run nothing has no params";
}

TEST_F(ServerTest, BadFlagsAreUsageErrors) {
  for (const std::vector<std::string>& extra : {std::vector<std::string>{"--no-such-flag"},
                                                {"-np", "0"},
                                                {"--kv", "q9"},
                                                {"--port", "70000"},
                                                {"--grammar", "'root ::= (\"a\"'"},
                                                {"-j", "'{\"type\": \"widget\"}'"},
                                                {"--grammar", "'root ::= \"a\"'", "-j", "'{}'"},
                                                // llama-server flags lamina cannot honour
                                                {"-ctk", "q8_0", "-ctv", "f16"},
                                                {"-ctk", "bf16", "-ctv", "bf16"},
                                                {"-ctk", "q8_0", "-ctv", "q8_0", "--kv", "f16"},
                                                {"--path", "/srv"},
                                                {"--api-prefix", "/v2"},
                                                {"--log-file", "x.log"},
                                                {"--spec-type", "draft-eagle3"},
                                                {"--reasoning-format", "r1"},
                                                {"--reasoning", "maybe"},
                                                {"--reasoning-budget", "-2"},
                                                {"--chat-template-kwargs", "[1]"},
                                                // fail-closed keys
                                                {"--api-key", "''"},
                                                {"--api-key", "'a b'"}}) {
    std::string cmd = kBinary + " serve -m " + kShipped + " --port " + std::to_string(FreePort());
    for (const std::string& a : extra) cmd += " " + a;
    cmd += " >/dev/null 2>&1";
    const int rc = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(rc), 2) << cmd;
  }
}

// llama-server's -ctk/-ctv pick lamina's KV mode; flags without meaning on a CPU warn once.
TEST_F(ServerTest, LlamaServerCacheTypesAndGpuFlags) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"-ctk", "q8_0", "-ctv", "q8_0"}, "int8"},
      {{"-ctk", "q8_0", "-ctv", "q4_0"}, "k8v4"},
      {{"--cache-type-k", "q4_0", "--cache-type-v", "q4_0"}, "q4_0"},
      {{"-ctk", "f32", "-ctv", "f32"}, "f32"}};
  for (const auto& [flags, mode] : cases) {
    std::vector<std::string> args = {"-m", kShipped};
    args.insert(args.end(), flags.begin(), flags.end());
    ServerProcess s(args);
    ASSERT_TRUE(s.healthy()) << s.Log();
    auto [st, props] = s.Get("/props");
    ASSERT_EQ(st, 200);
    EXPECT_EQ(props["kv_cache"]["type"], mode) << flags[1] << "/" << flags[3];
  }
  // --backend_sampling: llama-server reads "_" in a flag's name as "-".
  ServerProcess gpu({"-m", kShipped, "-ngl", "99", "-fa", "on", "--mlock", "--backend_sampling"});
  ASSERT_TRUE(gpu.healthy()) << gpu.Log();
  const std::string log = gpu.Log();
  for (const char* flag : {"--n-gpu-layers", "--flash-attn", "--mlock", "--backend-sampling"}) {
    EXPECT_NE(log.find(std::string("warning: ") + flag), std::string::npos) << log;
  }
  // llama.cpp's speculative spellings: --spec-type ngram-simple is --spec lookup.
  ServerProcess spec({"-m", kShipped, "--spec-type", "ngram-simple", "--spec-draft-n-max", "4",
                      "--spec-draft-n-min", "1"});
  ASSERT_TRUE(spec.healthy()) << spec.Log();
  EXPECT_EQ(spec.Get("/props").second["default_generation_settings"]["speculative"], true);
}

TEST_F(ServerTest, ContextFullStopsOrShifts) {
  const std::string prompt = ChatPrompt("Count from 1 to 300, one number per line.");
  {
    ServerProcess s({"-m", kShipped, "-c", "96"});
    ASSERT_TRUE(s.healthy()) << s.Log();
    auto [st, r] = s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["truncated"], true);
    EXPECT_EQ(r["stop_type"], "limit");
    // As llama-server: the last token sampled would have taken the slot's last cell.
    EXPECT_EQ(r["tokens_evaluated"].get<int>() + r["tokens_predicted"].get<int>(), 96);
    const std::string long_prompt(2000, 'x');
    auto [lst, too_long] = s.Post("/completion", {{"prompt", long_prompt}});
    EXPECT_EQ(lst, 400);
    EXPECT_EQ(too_long["error"]["type"], "exceed_context_size_error");
    EXPECT_EQ(too_long["error"]["n_ctx"], 96);
  }
  ServerProcess s({"-m", kShipped, "-c", "96", "--context-shift"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  auto [st, r] = s.Post(
      "/completion", {{"prompt", prompt}, {"temperature", 0}, {"n_predict", 200}, {"n_keep", -1}});
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["tokens_predicted"], 200);
  EXPECT_EQ(r["truncated"], true);
}

// Token counts and greedy tokens equal llama.cpp's (its goldens) on stories260K.
TEST(ServerStories, TokensMatchLlamaCpp) {
  const std::string model = kShared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  ServerProcess s({"-m", model, "--kv", "f32", "-c", "1024", "-t", "1"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  for (const char* name : {"bos", "once", "lily", "story300"}) {
    std::ifstream in(kShared + "/golden/stories260K/stories260K." + name + ".f32.json");
    ASSERT_TRUE(in) << name;
    const json golden = json::parse(in);
    const std::string prompt = golden["prompt"];
    auto [tst, tok] = s.Post("/tokenize", {{"content", prompt}, {"add_special", true}});
    EXPECT_EQ(tok["tokens"], golden["prompt_tokens"]) << name;
    auto [st, r] = s.Post("/completion", {{"prompt", prompt},
                                          {"n_predict", 16},
                                          {"temperature", 0},
                                          {"ignore_eos", true},
                                          {"return_tokens", true}});
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_EQ(r["tokens_evaluated"], golden["n_prompt_tokens"]) << name;
    std::vector<int> want(golden["generated_tokens"].begin(),
                          golden["generated_tokens"].begin() + 16);
    EXPECT_EQ(r["tokens"].get<std::vector<int>>(), want) << name;
  }
  // Byte-fallback pieces come back as their byte values: 日 is the bytes E6 97 A5.
  auto [pst, pieces] = s.Post("/tokenize", {{"content", "日"}, {"with_pieces", true}});
  ASSERT_EQ(pst, 200);
  json bytes = json::array();
  for (const json& t : pieces["tokens"]) {
    if (t["piece"].is_array()) bytes.insert(bytes.end(), t["piece"].begin(), t["piece"].end());
  }
  EXPECT_EQ(bytes, json({0xE6, 0x97, 0xA5})) << pieces.dump();
}

// SIGTERM ends the server within a few seconds, with a request in flight, and the port can be
// bound again at once.
TEST_F(ServerTest, SigtermFreesThePortAtOnce) {
  ServerProcess first({"-m", kShipped});
  ASSERT_TRUE(first.healthy()) << first.Log();
  std::thread client([&] {
    first.Post("/completion", {{"prompt", "1"}, {"ignore_eos", true}, {"n_predict", 3000}});
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(first.Stop(), 0) << first.Log();
  client.join();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  ServerProcess second({"-m", kShipped}, first.port());
  EXPECT_TRUE(second.healthy()) << "the port was not free again: " << second.Log();
}

// Eight greedy requests of different prompts and lengths at once (half streaming; -np 4, so
// some queue) give exactly the text each gives alone, in every KV mode, at -b 16 and -b 32.
TEST(ServerBatchInvariance, ConcurrentRequestsEqualSoloRuns) {
  const std::string model = kShared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "Lily and Ben went to the park. They",
                                            "Tom had a small red boat. One day the wind was strong",
                                            "The cat",
                                            "A big dog ran",
                                            "Sue found a shiny key under the old tree. She",
                                            "Max",
                                            "One day, a little bird wanted to fly"};
  auto body = [&](size_t i) {
    return json{{"prompt", prompts[i]},
                {"n_predict", 20 + 9 * static_cast<int>(i)},
                {"temperature", 0},
                {"ignore_eos", true}};
  };
  for (const char* kv : {"f32", "f16", "int8", "q4_0", "k8v4"}) {
    std::vector<std::string> solo(prompts.size());
    for (const char* batch : {"16", "32"}) {
      ServerProcess s({"-m", model, "--kv", kv, "-np", "4", "-c", "1024", "-b", batch});
      ASSERT_TRUE(s.healthy()) << s.Log();
      if (solo[0].empty()) {
        for (size_t i = 0; i < prompts.size(); ++i) {
          json b = body(i);
          b["cache_prompt"] = false;
          auto [st, r] = s.Post("/completion", b);
          ASSERT_EQ(st, 200);
          solo[i] = r["content"];
          ASSERT_FALSE(solo[i].empty());
        }
      }
      std::vector<std::string> together(prompts.size());
      std::vector<std::thread> threads;
      for (size_t i = 0; i < prompts.size(); ++i) {
        threads.emplace_back([&, i] {
          if (i % 2 == 0) {
            together[i] = StreamCompletion(s, body(i)).first;
          } else {
            together[i] = s.Post("/completion", body(i)).second.value("content", "");
          }
        });
      }
      for (std::thread& t : threads) t.join();
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(together[i], solo[i]) << "kv " << kv << " -b " << batch << " request " << i;
      }
    }
  }
}

// --kv-unified: each slot may use the whole -c context (four slots, 256 cells shared), a request
// starting only when its prompt and n_predict fit beside the running ones'; every answer is its
// solo run's and none is cut short. Without it each slot has 256 / 4 cells.
TEST(ServerBatchInvariance, KvUnifiedSlotsShareTheContext) {
  const std::string model = kShared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  const std::vector<int> n_predict = {80, 40, 80, 80, 70, -1};
  auto body = [&](size_t i) {
    return json{
        {"prompt", "Once"}, {"n_predict", n_predict[i]}, {"temperature", 0}, {"ignore_eos", true}};
  };
  ServerProcess s({"-m", model, "-np", "4", "-c", "256", "--kv-unified"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  EXPECT_EQ(s.Get("/props").second["default_generation_settings"]["n_ctx"], 256);
  std::vector<json> solo(n_predict.size());
  for (size_t i = 0; i < n_predict.size(); ++i) {
    json b = body(i);
    b["cache_prompt"] = false;
    auto [st, r] = s.Post("/completion", b);
    ASSERT_EQ(st, 200) << r.dump();
    solo[i] = r;
  }
  EXPECT_EQ(solo[0]["tokens_predicted"], 80);
  EXPECT_EQ(solo.back()["tokens_evaluated"].get<int>() + solo.back()["tokens_predicted"].get<int>(),
            256);
  std::vector<json> together(n_predict.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n_predict.size(); ++i) {
    threads.emplace_back([&, i] { together[i] = s.Post("/completion", body(i)).second; });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < n_predict.size(); ++i) {
    EXPECT_EQ(together[i]["content"], solo[i]["content"]) << "request " << i;
    EXPECT_EQ(together[i]["tokens_predicted"], solo[i]["tokens_predicted"]) << "request " << i;
  }
  ServerProcess split({"-m", model, "-np", "4", "-c", "256"});
  ASSERT_TRUE(split.healthy()) << split.Log();
  auto [st, r] = split.Post("/completion", body(0));
  ASSERT_EQ(st, 200);
  EXPECT_EQ(r["tokens_evaluated"].get<int>() + r["tokens_predicted"].get<int>(), 64);
  EXPECT_EQ(r["truncated"], true);
}

// Speculative slots (prompt lookup; the shipped model drafting for itself from a q4_0 cache,
// always drafting) answer eight concurrent requests, streamed and not, exactly as a plain
// server answers each alone; -b 16 makes verify windows shrink to fit the batch.
TEST_F(ServerTest, SpeculativeSlotsAnswerAsPlainSoloRuns) {
  const std::vector<std::string> users = {
      "Count from 1 to 40, one number per line.",
      "Repeat this list exactly, one item per line:\nDavid\nKate\nEmma\nIris\nDavid\nKate\nSam",
      "Write a JSON object with the fields \"name\" = \"Alice\", \"age\" = 34.",
      "Tell me a short story about a cat.",
      "Count from 95 to 120, one number per line.",
      "Repeat this list exactly, one item per line:\nBob\nLeo\nBob\nLeo\nMax",
      "Write a JSON array of these values: \"red\", 7, \"blue\".",
      "Tell me a short story about a dog."};
  auto body = [&](size_t i) {
    return json{{"prompt", ChatPrompt(users[i])}, {"n_predict", 48}, {"temperature", 0}};
  };
  std::vector<std::string> solo(users.size());
  {
    ServerProcess plain({"-m", kShipped, "-np", "1", "-c", "1024"});
    ASSERT_TRUE(plain.healthy()) << plain.Log();
    for (size_t i = 0; i < users.size(); ++i) {
      json b = body(i);
      b["cache_prompt"] = false;
      auto [st, r] = plain.Post("/completion", b);
      ASSERT_EQ(st, 200);
      solo[i] = r["content"];
    }
  }
  const std::vector<std::vector<std::string>> configs = {
      {"--spec", "lookup", "--spec-fixed"},
      {"-md", kShipped, "--kv-draft", "q4_0", "--draft-max", "6", "--spec-fixed"}};
  for (const auto& extra : configs) {
    std::vector<std::string> args = {"-m", kShipped, "-np", "4", "-c", "2048", "-b", "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    ServerProcess s(args);
    ASSERT_TRUE(s.healthy()) << s.Log();
    EXPECT_EQ(s.Get("/props").second["default_generation_settings"]["speculative"], true);
    std::vector<std::string> together(users.size());
    std::vector<json> timings(users.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < users.size(); ++i) {
      threads.emplace_back([&, i] {
        if (i % 2 == 0) {
          auto [text, last] = StreamCompletion(s, body(i));
          together[i] = text;
          timings[i] = last.value("timings", json());
        } else {
          json r = s.Post("/completion", body(i)).second;
          together[i] = r.value("content", "");
          timings[i] = r.value("timings", json());
        }
      });
    }
    for (std::thread& t : threads) t.join();
    long long drafted = 0, accepted = 0;
    for (size_t i = 0; i < users.size(); ++i) {
      EXPECT_EQ(together[i], solo[i]) << extra[1] << " request " << i;
      drafted += timings[i].value("draft_n", 0LL);
      accepted += timings[i].value("draft_n_accepted", 0LL);
    }
    EXPECT_GT(drafted, 0) << extra[1];
    EXPECT_GT(accepted, 0) << extra[1];
  }
}

// 64 clients at once, some cancelling mid-stream, some giving up on a long non-streamed answer
// and some sending oversize bodies: no crash, every answer is its own request's, every slot is
// freed.
TEST_F(ServerTest, SixtyFourClientsWithCancellations) {
  ServerProcess s({"-m", kShipped, "-np", "4", "-c", "4096", "--max-body", "100000"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  std::atomic<int> ok{0}, cancelled{0}, refused{0}, wrong{0}, gave_up{0};
  std::vector<std::thread> clients;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      const int n = 3 + i % 20;
      const std::string prompt =
          ChatPrompt("Count from 1 to " + std::to_string(n) + ", one number per line.");
      httplib::Client c = s.Client();
      if (i % 8 == 3) {  // oversize body
        auto r = c.Post("/completion", std::string(150000, 'x'), "application/json");
        if (r && r->status == 413) ++refused;
        return;
      }
      if (i % 8 == 7) {  // a long answer without streaming, given up after 150 ms
        c.set_read_timeout(0, 150000);
        auto r = c.Post("/completion",
                        json({{"prompt", prompt}, {"ignore_eos", true}, {"n_predict", 900}}).dump(),
                        "application/json");
        if (!r) ++gave_up;
        return;
      }
      if (i % 4 == 1) {  // streams, then hangs up after a few events
        int events = 0;
        httplib::Request req;
        req.method = "POST";
        req.path = "/completion";
        req.body =
            json({{"prompt", prompt}, {"stream", true}, {"ignore_eos", true}, {"n_predict", 900}})
                .dump();
        req.set_header("Content-Type", "application/json");
        req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
          return ++events < 3;
        };
        c.send(req);
        ++cancelled;
        return;
      }
      auto r = c.Post("/completion", json({{"prompt", prompt}, {"temperature", 0}}).dump(),
                      "application/json");
      if (r && r->status == 200 && json::parse(r->body)["content"] == Count(n)) {
        ++ok;
      } else {
        ++wrong;
        std::printf("client %d: %s\n", i,
                    r ? (std::to_string(r->status) + " " + r->body).c_str()
                      : httplib::to_string(r.error()).c_str());
      }
    });
  }
  for (std::thread& t : clients) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(ok, 32);
  EXPECT_EQ(refused, 8);
  EXPECT_EQ(cancelled, 16);
  EXPECT_EQ(gave_up, 8);
  // Every slot frees (the cancelled streams within a step or two of their hang-up).
  bool idle = false;
  const auto t_wait = std::chrono::steady_clock::now();
  for (int i = 0; i < 400 && !idle; ++i) {
    auto [st, slots] = s.Get("/slots");
    idle = st == 200;
    for (const json& slot : slots) idle = idle && !slot["is_processing"].get<bool>();
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(idle);
  const double wait =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
  EXPECT_LT(seconds, 120.0);
  std::printf("64 clients: %.2f s; every slot idle %.2f s after the last client\n", seconds, wait);
  auto metrics = s.Client().Get("/metrics");
  ASSERT_TRUE(metrics);
  const std::string key = "\nlamina:requests_cancelled_total ";
  const size_t at = metrics->body.find(key);
  ASSERT_NE(at, std::string::npos);
  // The hung-up streams and the abandoned long answers (24; measured: all 24) were cut short,
  // not run to their end.
  EXPECT_GE(std::atof(metrics->body.c_str() + at + key.size()), 20.0) << metrics->body;
  EXPECT_EQ(s.Stop(), 0) << s.Log();
}

}  // namespace

// Constrained output over HTTP: response_format (json_schema, json_object), json_schema and
// grammar give valid output; concurrent constrained requests (also drafted by prompt lookup)
// answer exactly as each alone; malformed grammars and schemas are 400s naming the position.
TEST_F(ServerTest, StructuredOutput) {
  const json person = {
      {"type", "object"},
      {"properties",
       {{"name", {{"type", "string"}, {"maxLength", 10}}},
        {"age", {{"type", "integer"}}},
        {"pets", {{"type", "array"}, {"items", {{"enum", {"cat", "dog"}}}}, {"maxItems", 3}}}}},
      {"required", {"name", "age", "pets"}}};
  const std::string user =
      "Write a JSON object with the fields \"name\" = \"Alice\", \"age\" = 34.";
  const std::vector<json> bodies = {
      {{"prompt", ChatPrompt(user)}, {"json_schema", person}},
      {{"prompt", ChatPrompt(user)}, {"response_format", {{"type", "json_object"}}}},
      {{"prompt", ChatPrompt("Is the sky blue?")},
       {"grammar", "root ::= (\"yes\" | \"no\") \".\""}},
      {{"prompt", ChatPrompt("Count from 1 to 5.")},
       {"grammar", "root ::= [0-9]+ (\"\\n\" [0-9]+){2,6}"}},
      {{"prompt", ChatPrompt("Tell me a short story about a cat.")}},
  };
  auto check = [&](size_t i, const std::string& content) {
    if (i <= 1) {
      const json doc = json::parse(content, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << content;
      if (i == 0) {
        EXPECT_TRUE(doc["name"].is_string() && doc["age"].is_number_integer() &&
                    doc["pets"].is_array() && doc["pets"].size() <= 3)
            << content;
        EXPECT_EQ(doc.size(), 3u) << content;
      }
    } else if (i == 2) {
      EXPECT_TRUE(content == "yes." || content == "no.") << content;
    } else if (i == 3) {
      EXPECT_TRUE(std::regex_match(content, std::regex("[0-9]+(\n[0-9]+){2,6}"))) << content;
    }
  };
  std::vector<std::string> solo(bodies.size());
  {
    ServerProcess plain({"-m", kShipped, "-np", "1", "-c", "1024"});
    ASSERT_TRUE(plain.healthy()) << plain.Log();
    for (size_t i = 0; i < bodies.size(); ++i) {
      json b = bodies[i];
      b["temperature"] = 0;
      b["n_predict"] = 120;
      b["cache_prompt"] = false;
      auto [st, r] = plain.Post("/completion", b);
      ASSERT_EQ(st, 200) << r.dump();
      solo[i] = r["content"];
      check(i, solo[i]);
    }
    // The OpenAI chat route with response_format json_schema (OpenAI's wrapper object).
    auto [cst, chat] = plain.Post(
        "/v1/chat/completions",
        {{"messages", {{{"role", "user"}, {"content", user}}}},
         {"temperature", 0},
         {"max_tokens", 120},
         {"response_format",
          {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", person}}}}}});
    ASSERT_EQ(cst, 200) << chat.dump();
    EXPECT_EQ(chat["choices"][0]["message"]["content"], solo[0]);
    // Malformed input: 400 with the position.
    auto [g1, bad_grammar] =
        plain.Post("/completion", {{"prompt", "x"}, {"grammar", "root ::= (\"a\""}});
    EXPECT_EQ(g1, 400);
    EXPECT_NE(bad_grammar["error"]["message"].get<std::string>().find("line 1, column"),
              std::string::npos)
        << bad_grammar.dump();
    auto [g2, bad_schema] =
        plain.Post("/completion", {{"prompt", "x"}, {"json_schema", {{"type", "widget"}}}});
    EXPECT_EQ(g2, 400);
    EXPECT_NE(bad_schema["error"]["message"].get<std::string>().find("json_schema at /type"),
              std::string::npos)
        << bad_schema.dump();
    auto [g3, both] = plain.Post(
        "/completion",
        {{"prompt", "x"}, {"grammar", "root ::= \"a\""}, {"json_schema", json::object()}});
    EXPECT_EQ(g3, 400);
    auto [g4, bad_format] =
        plain.Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}},
                                            {"response_format", {{"type", "yaml"}}}});
    EXPECT_EQ(g4, 400);
  }
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--spec", "lookup", "--spec-fixed"}}) {
    std::vector<std::string> args = {"-m", kShipped, "-np", "4", "-c", "4096", "-b", "16"};
    args.insert(args.end(), extra.begin(), extra.end());
    ServerProcess s(args);
    ASSERT_TRUE(s.healthy()) << s.Log();
    std::vector<std::string> together(bodies.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < bodies.size(); ++i) {
      threads.emplace_back([&, i] {
        json b = bodies[i];
        b["temperature"] = 0;
        b["n_predict"] = 120;
        if (i % 2 == 0) {
          together[i] = StreamCompletion(s, b).first;
        } else {
          together[i] = s.Post("/completion", b).second.value("content", "");
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (size_t i = 0; i < bodies.size(); ++i) {
      EXPECT_EQ(together[i], solo[i]) << (extra.empty() ? "plain" : "lookup") << " request " << i;
    }
  }
}

// llama-server's sampling extras on stories260K: n_probs gives exactly N entries per token, a
// -100 (or false) logit bias keeps a word out, response_fields returns exactly the keys asked
// for (nested paths flattened), /apply-template renders the chat template.
TEST(ServerStories, SamplingExtras) {
  const std::string model = kShared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  ServerProcess s({"-m", model, "-c", "1024", "-t", "1"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json base = {{"prompt", "Once upon a time"}, {"n_predict", 24}, {"temperature", 0}};
  auto [st, plain] = s.Post("/completion", base);
  ASSERT_EQ(st, 200);
  const std::string text = plain["content"];
  json with_probs = base;
  with_probs["n_probs"] = 5;
  auto [pst, probs] = s.Post("/completion", with_probs);
  ASSERT_EQ(pst, 200);
  ASSERT_EQ(probs["completion_probabilities"].size(), 24u);
  for (const json& e : probs["completion_probabilities"]) EXPECT_EQ(e["top_logprobs"].size(), 5u);
  // post_sampling_probs: probabilities after the sampler chain; with top_k 3 the lists are
  // shorter than n_probs and sum to 1; greedy gives the chosen token alone, at 1.
  json post = with_probs;
  post["post_sampling_probs"] = true;
  post["temperature"] = 0.8;
  post["top_k"] = 3;
  post["seed"] = 7;
  auto [qst, sampled] = s.Post("/completion", post);
  ASSERT_EQ(qst, 200) << sampled.dump();
  ASSERT_EQ(sampled["completion_probabilities"].size(), 24u);
  for (const json& e : sampled["completion_probabilities"]) {
    ASSERT_TRUE(e.contains("prob") && e.contains("top_probs")) << e.dump();
    EXPECT_GT(e["prob"].get<double>(), 0.0);
    EXPECT_LE(e["top_probs"].size(), 3u);
    double sum = 0.0;
    for (const json& t : e["top_probs"]) sum += t["prob"].get<double>();
    EXPECT_NEAR(sum, 1.0, 1e-4) << e.dump();
  }
  post["temperature"] = 0;
  auto [gst, greedy] = s.Post("/completion", post);
  ASSERT_EQ(gst, 200);
  for (const json& e : greedy["completion_probabilities"]) {
    ASSERT_EQ(e["top_probs"].size(), 1u);
    EXPECT_EQ(e["prob"].get<double>(), 1.0);
  }
  // The answer's most frequent word, biased out as text and by its token ids.
  const std::string word = " Lily";
  ASSERT_NE(text.find(word), std::string::npos) << text;
  for (const json& bias :
       {json::array({json::array({word, -100})}), json::array({json::array({word, false})})}) {
    json b = base;
    b["logit_bias"] = bias;
    auto [bst, biased] = s.Post("/completion", b);
    ASSERT_EQ(bst, 200) << biased.dump();
    EXPECT_EQ(biased["content"].get<std::string>().find(word), std::string::npos)
        << biased["content"];
    EXPECT_FALSE(biased["generation_settings"]["logit_bias"].empty());
  }
  // llama-server lists biases as {"bias", "token"} (null: never sampled), ignore_eos's too; the
  // answer's prompt is its tokens' text, BOS included.
  json no_eos = base;
  no_eos["ignore_eos"] = true;
  no_eos["logit_bias"] = {{5, 2}};
  auto [est, ignored] = s.Post("/completion", no_eos);
  ASSERT_EQ(est, 200);
  const json listed = ignored["generation_settings"]["logit_bias"];
  ASSERT_EQ(listed.size(), 2u) << listed.dump();  // stories260K's one end-of-generation token
  EXPECT_EQ(listed[0], json({{"bias", 2.0}, {"token", 5}}));
  EXPECT_TRUE(listed[1]["bias"].is_null()) << listed.dump();
  EXPECT_EQ(ignored["prompt"], "<s> Once upon a time");
  auto [tst, tok] = s.Post("/tokenize", {{"content", word}});
  json by_id = json::object();
  for (const json& id : tok["tokens"]) by_id[std::to_string(id.get<int>())] = -100;
  json b = base;
  b["logit_bias"] = by_id;
  auto [ist, by_ids] = s.Post("/completion", b);
  ASSERT_EQ(ist, 200);
  EXPECT_EQ(by_ids["content"].get<std::string>().find(word), std::string::npos);
  json fields = base;
  fields["response_fields"] = {"content", "generation_settings/n_predict", "timings/predicted_n",
                               "no/such"};
  auto [fst, picked] = s.Post("/completion", fields);
  ASSERT_EQ(fst, 200);
  EXPECT_EQ(picked.size(), 3u) << picked.dump();
  EXPECT_EQ(picked["content"], text);
  EXPECT_EQ(picked["generation_settings/n_predict"], 24);
  EXPECT_EQ(picked["timings/predicted_n"], 24);
  auto [ast, applied] =
      s.Post("/apply-template", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(ast, 200) << applied.dump();
  EXPECT_NE(applied["prompt"].get<std::string>().find("Hi"), std::string::npos);
  auto [e1, bad_bias] = s.Post("/completion", {{"prompt", "x"}, {"logit_bias", {{1, "x"}}}});
  EXPECT_EQ(e1, 400);
  auto [e2, bad_id] = s.Post("/completion", {{"prompt", "x"}, {"logit_bias", {{"99999", 1}}}});
  EXPECT_EQ(e2, 400);
}

// OpenAI `n` (llama-server `n_cmpl`): n choices of one prompt, choice i sampled with seed + i,
// the prompt counted once in usage, streamed chunks naming their choice; assistant prefill;
// /v1/chat/completions/input_tokens; timings_per_token and return_progress while streaming.
TEST_F(ServerTest, ChoicesPrefillInputTokensAndProgress) {
  ServerProcess s({"-m", kShipped, "-np", "2", "-c", "2048", "-b", "8"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json messages = {
      {{"role", "user"}, {"content", "Count from 1 to 8, one number per line."}}};
  auto [st1, one] = s.Post("/v1/chat/completions", {{"messages", messages}, {"temperature", 0}});
  ASSERT_EQ(st1, 200) << one.dump();
  const int n_prompt = one["usage"]["prompt_tokens"];
  const int n_completion = one["usage"]["completion_tokens"];
  auto [st3, three] =
      s.Post("/v1/chat/completions", {{"messages", messages}, {"temperature", 0}, {"n", 3}});
  ASSERT_EQ(st3, 200) << three.dump();
  ASSERT_EQ(three["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(three["choices"][i]["index"], i);
    EXPECT_EQ(three["choices"][i]["message"]["content"], Count(8));
    EXPECT_EQ(three["choices"][i]["finish_reason"], "stop");
  }
  EXPECT_EQ(three["usage"]["prompt_tokens"], n_prompt);
  EXPECT_EQ(three["usage"]["completion_tokens"], 3 * n_completion);
  EXPECT_EQ(three["usage"]["total_tokens"], n_prompt + 3 * n_completion);
  // Sampled: choice i is the single request with seed + i.
  const json sampled = {{"messages", messages}, {"temperature", 1.5}, {"max_tokens", 12}};
  json pair_body = sampled;
  pair_body["n"] = 2;
  pair_body["seed"] = 11;
  auto [sp, pair] = s.Post("/v1/chat/completions", pair_body);
  ASSERT_EQ(sp, 200) << pair.dump();
  for (int i = 0; i < 2; ++i) {
    json b = sampled;
    b["seed"] = 11 + i;
    auto [ss, single] = s.Post("/v1/chat/completions", b);
    ASSERT_EQ(ss, 200);
    EXPECT_EQ(pair["choices"][i]["message"]["content"], single["choices"][0]["message"]["content"])
        << "choice " << i;
  }
  // Text completions: two prompts times n = 2, prompt-major; usage counts each prompt once.
  const std::string p8 = ChatPrompt("Count from 1 to 8, one number per line.");
  const std::string p3 = ChatPrompt("Count from 1 to 3, one number per line.");
  auto [sc, cmpl] = s.Post("/v1/completions", {{"prompt", {p8, p3}}, {"temperature", 0}, {"n", 2}});
  ASSERT_EQ(sc, 200) << cmpl.dump();
  ASSERT_EQ(cmpl["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(cmpl["choices"][i]["index"], i);
    EXPECT_EQ(cmpl["choices"][i]["text"], Count(i < 2 ? 8 : 3));
  }
  auto [t8, tok8] = s.Post("/tokenize", {{"content", p8}, {"add_special", true}});
  auto [t3, tok3] = s.Post("/tokenize", {{"content", p3}, {"add_special", true}});
  EXPECT_EQ(cmpl["usage"]["prompt_tokens"], tok8["tokens"].size() + tok3["tokens"].size());
  auto [sn, native] = s.Post("/completion", {{"prompt", p8}, {"temperature", 0}, {"n_cmpl", 2}});
  ASSERT_EQ(sn, 200) << native.dump();
  ASSERT_TRUE(native.is_array());
  ASSERT_EQ(native.size(), 2u);
  EXPECT_EQ(native[1]["index"], 1);
  EXPECT_EQ(native[1]["content"], Count(8));
  // The choices of a new prompt evaluate it once: the second copies the first one's cells.
  auto [sf, fresh] = s.Post("/completion", {{"prompt", ChatPrompt("Count from 1 to 5, please.")},
                                            {"temperature", 0},
                                            {"n_predict", 8},
                                            {"n_cmpl", 2}});
  ASSERT_EQ(sf, 200) << fresh.dump();
  const int n_fresh = fresh[0]["tokens_evaluated"];
  EXPECT_GT(fresh[0]["timings"]["prompt_n"].get<int>(), 1);
  EXPECT_EQ(fresh[1]["timings"]["cache_n"], n_fresh - 1);
  EXPECT_EQ(fresh[1]["timings"]["prompt_n"], 1);
  EXPECT_EQ(fresh[1]["content"], fresh[0]["content"]);
  for (const json& bad : {json(17), json(0), json("two")}) {
    auto [sb, err] = s.Post("/v1/chat/completions", {{"messages", messages}, {"n", bad}});
    EXPECT_EQ(sb, 400) << bad;
    EXPECT_NE(err["error"]["message"].get<std::string>().find("\"n\""), std::string::npos)
        << err.dump();
  }
  auto [sl, limit] = s.Post("/v1/chat/completions", {{"messages", messages}, {"n", 17}});
  EXPECT_EQ(limit["error"]["message"], "\"n\" must be an integer in [1, 16], got 17");
  // Streamed choices interleave; each adds up to the same answer and ends once.
  {
    httplib::Client c = s.Client();
    auto r = c.Post("/v1/chat/completions",
                    json({{"messages", messages},
                          {"temperature", 0},
                          {"n", 2},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}})
                        .dump(),
                    "application/json");
    ASSERT_TRUE(r && r->status == 200);
    std::string texts[2];
    int finishes[2] = {0, 0};
    json usage;
    for (const json& e : SseEvents(r->body)) {
      if (e.contains("usage")) usage = e["usage"];
      for (const json& ch : e["choices"]) {
        const int i = ch["index"];
        ASSERT_TRUE(i == 0 || i == 1) << e.dump();
        if (ch["delta"].contains("content") && ch["delta"]["content"].is_string())
          texts[i] += ch["delta"]["content"].get<std::string>();
        if (!ch["finish_reason"].is_null()) ++finishes[i];
      }
    }
    EXPECT_EQ(texts[0], Count(8));
    EXPECT_EQ(texts[1], Count(8));
    EXPECT_EQ(finishes[0], 1);
    EXPECT_EQ(finishes[1], 1);
    EXPECT_EQ(usage["prompt_tokens"], n_prompt);
    EXPECT_EQ(usage["completion_tokens"], 2 * n_completion);
  }

  {
    httplib::Client c = s.Client();
    auto r = c.Post("/v1/completions",
                    json({{"prompt", p8},
                          {"temperature", 0},
                          {"n", 2},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}})
                        .dump(),
                    "application/json");
    ASSERT_TRUE(r && r->status == 200);
    std::string texts[2];
    int usages = 0;
    json last;
    for (const json& e : SseEvents(r->body)) {
      const int i = e["choices"][0]["index"];
      texts[i] += e["choices"][0]["text"].get<std::string>();
      usages += e.contains("usage");
      last = e;
    }
    EXPECT_EQ(texts[0], Count(8));
    EXPECT_EQ(texts[1], Count(8));
    EXPECT_EQ(usages, 1);
    EXPECT_EQ(last["usage"]["prompt_tokens"], tok8["tokens"].size());
    EXPECT_EQ(last["usage"]["completion_tokens"], 2 * n_completion);
  }

  // Assistant prefill: the last assistant message is continued; the answer is the new text.
  json prefill = messages;
  prefill.push_back({{"role", "assistant"}, {"content", "1\n2\n3"}});
  auto [ap, applied] = s.Post("/apply-template", {{"messages", prefill}});
  ASSERT_EQ(ap, 200);
  EXPECT_TRUE(applied["prompt"].get<std::string>().ends_with("<|im_start|>assistant\n1\n2\n3"))
      << applied.dump();
  auto [pc, continued] =
      s.Post("/v1/chat/completions", {{"messages", prefill}, {"temperature", 0}});
  ASSERT_EQ(pc, 200) << continued.dump();
  EXPECT_EQ(continued["choices"][0]["message"]["content"], "\n4\n5\n6\n7\n8");
  auto [ac, closed] =
      s.Post("/apply-template", {{"messages", prefill}, {"continue_final_message", false}});
  ASSERT_EQ(ac, 200);
  EXPECT_TRUE(
      closed["prompt"].get<std::string>().ends_with("1\n2\n3<|im_end|>\n<|im_start|>assistant\n"))
      << closed.dump();
  auto [e1, no_assistant] =
      s.Post("/v1/chat/completions", {{"messages", messages}, {"continue_final_message", true}});
  EXPECT_EQ(e1, 400);
  EXPECT_NE(no_assistant.dump().find("continue_final_message"), std::string::npos);
  json two = prefill;
  two.push_back({{"role", "assistant"}, {"content", "4"}});
  auto [e2, two_assistants] = s.Post("/v1/chat/completions", {{"messages", two}});
  EXPECT_EQ(e2, 400) << two_assistants.dump();
  auto [e3, bad_flag] =
      s.Post("/apply-template", {{"messages", prefill}, {"continue_final_message", "yes"}});
  EXPECT_EQ(e3, 400);

  // input_tokens: the chat request's prompt tokens, both spellings.
  for (const char* path : {"/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"}) {
    auto [it, counted] = s.Post(path, {{"messages", messages}, {"temperature", 0}});
    ASSERT_EQ(it, 200) << counted.dump();
    EXPECT_EQ(counted["object"], "response.input_tokens");
    EXPECT_EQ(counted["input_tokens"], n_prompt);
  }
  auto [ib, bad_count] = s.Post("/v1/chat/completions/input_tokens", {{"messages", "hi"}});
  EXPECT_EQ(ib, 400);
  EXPECT_NE(bad_count.dump().find("messages"), std::string::npos);

  // timings_per_token: every streamed piece carries the timings so far.
  {
    httplib::Client c = s.Client();
    auto r = c.Post(
        "/completion",
        json({{"prompt", p8}, {"temperature", 0}, {"stream", true}, {"timings_per_token", true}})
            .dump(),
        "application/json");
    ASSERT_TRUE(r && r->status == 200);
    int last_n = 0, pieces = 0;
    for (const json& e : SseEvents(r->body)) {
      if (e["stop"] == true) break;
      ++pieces;
      ASSERT_TRUE(e.contains("timings")) << e.dump();
      const int n = e["timings"]["predicted_n"];
      EXPECT_GE(n, last_n);
      last_n = n;
    }
    EXPECT_GT(pieces, 0);
    EXPECT_GT(last_n, 0);
  }
  // return_progress: prompt_progress events (batches of 8) before the first piece, up to the
  // whole prompt.
  for (const char* path : {"/completion", "/v1/chat/completions"}) {
    const bool chat = std::string(path) != "/completion";
    json body = {{"temperature", 0},
                 {"stream", true},
                 {"return_progress", true},
                 {"cache_prompt", false},
                 {"n_predict", 4}};
    if (chat) {
      body["messages"] = messages;
    } else {
      body["prompt"] = p8;
    }
    httplib::Client c = s.Client();
    auto r = c.Post(path, body.dump(), "application/json");
    ASSERT_TRUE(r && r->status == 200);
    std::vector<json> progress;
    bool text_seen = false;
    for (const json& e : SseEvents(r->body)) {
      if (e.contains("prompt_progress")) {
        EXPECT_FALSE(text_seen) << e.dump();
        progress.push_back(e["prompt_progress"]);
        continue;
      }
      const std::string piece =
          chat ? (e["choices"].empty() || !e["choices"][0]["delta"].contains("content") ||
                          !e["choices"][0]["delta"]["content"].is_string()
                      ? ""
                      : e["choices"][0]["delta"]["content"].get<std::string>())
               : e.value("content", "");
      text_seen = text_seen || !piece.empty();
    }
    ASSERT_GE(progress.size(), 2u) << path;
    EXPECT_EQ(progress.front()["processed"], 0) << path;  // the start, as llama-server sends
    const int total = progress.back()["total"];
    EXPECT_EQ(total, chat ? n_prompt : static_cast<int>(tok8["tokens"].size())) << path;
    EXPECT_EQ(progress.back()["processed"], total);
    EXPECT_EQ(progress.back()["cache"], 0);
    for (size_t i = 1; i < progress.size(); ++i) {
      EXPECT_GT(progress[i]["processed"].get<int>(), progress[i - 1]["processed"].get<int>());
      EXPECT_LE(progress[i]["processed"].get<int>() - progress[i - 1]["processed"].get<int>(), 8);
    }
  }
  EXPECT_EQ(s.Stop(), 0) << s.Log();
}

// Server-wide grammar defaults (--grammar, -j/--json-schema, their file forms): every request
// follows them unless it brings its own constraint or turns it off.
TEST_F(ServerTest, ServerDefaultGrammar) {
  const fs::path schema =
      fs::temp_directory_path() / ("lamina-schema-" + std::to_string(getpid()) + ".json");
  {
    std::ofstream out(schema);
    out << R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";
  }
  const std::string prompt = ChatPrompt("Count from 1 to 8, one number per line.");
  {
    ServerProcess s(
        {"-m", kShipped, "-c", "1024", "--grammar", "root ::= (\"yes\" | \"no\") \".\""});
    ASSERT_TRUE(s.healthy()) << s.Log();
    auto [st, r] = s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}});
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_TRUE(r["content"] == "yes." || r["content"] == "no.") << r.dump();
    auto [ct, chat] = s.Post(
        "/v1/chat/completions",
        {{"messages", {{{"role", "user"}, {"content", "Is the sky blue?"}}}}, {"temperature", 0}});
    ASSERT_EQ(ct, 200);
    const std::string answer = chat["choices"][0]["message"]["content"];
    EXPECT_TRUE(answer == "yes." || answer == "no.") << answer;
    // A request's own grammar replaces the default; "grammar": "" turns it off.
    auto [ot, own] = s.Post(
        "/completion",
        {{"prompt", prompt}, {"temperature", 0}, {"grammar", "root ::= [0-9] (\"\\n\" [0-9])*"}});
    ASSERT_EQ(ot, 200) << own.dump();
    EXPECT_EQ(own["content"], Count(8));
    auto [ft, off] =
        s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}, {"grammar", ""}});
    EXPECT_EQ(off["content"], Count(8));
    auto [tt, text] = s.Post("/v1/chat/completions",
                             {{"messages", {{{"role", "user"}, {"content", "Count from 1 to 3."}}}},
                              {"temperature", 0},
                              {"max_tokens", 20},
                              {"response_format", {{"type", "text"}}}});
    ASSERT_EQ(tt, 200);
    EXPECT_NE(text["choices"][0]["message"]["content"], "yes.");
    EXPECT_NE(text["choices"][0]["message"]["content"], "no.");
  }
  {
    ServerProcess s({"-m", kShipped, "-c", "1024", "-jf", schema.string()});
    ASSERT_TRUE(s.healthy()) << s.Log();
    auto [st, r] =
        s.Post("/completion", {{"prompt", prompt}, {"temperature", 0}, {"n_predict", 60}});
    ASSERT_EQ(st, 200) << r.dump();
    const json doc = json::parse(r["content"].get<std::string>(), nullptr, false);
    ASSERT_FALSE(doc.is_discarded()) << r.dump();
    EXPECT_TRUE(doc["n"].is_number_integer()) << r.dump();
  }
  fs::remove(schema);
}

// Sampled choices on stories260K: choice i of `n_cmpl` / `n` is the single request with the
// seed + i, so a fixed seed gives different answers that a client can reproduce one by one.
TEST(ServerStories, ChoicesUseSeedPlusIndex) {
  const std::string model = kShared + "/models/stories260K.gguf";
  if (!fs::exists(model)) GTEST_SKIP() << model << " is absent";
  ServerProcess s({"-m", model, "-c", "1024", "-np", "2", "-t", "1"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json base = {
      {"prompt", "Once upon a time"}, {"n_predict", 16}, {"temperature", 1}, {"seed", 5}};
  json many = base;
  many["n_cmpl"] = 3;
  auto [st, answers] = s.Post("/completion", many);
  ASSERT_EQ(st, 200) << answers.dump();
  ASSERT_EQ(answers.size(), 3u);
  std::set<std::string> distinct;
  for (int i = 0; i < 3; ++i) {
    json one = base;
    one["seed"] = 5 + i;
    auto [ost, single] = s.Post("/completion", one);
    ASSERT_EQ(ost, 200);
    EXPECT_EQ(answers[i]["index"], i);
    EXPECT_EQ(answers[i]["content"], single["content"]) << "choice " << i;
    EXPECT_EQ(answers[i]["generation_settings"]["seed"], 5 + i);
    distinct.insert(answers[i]["content"].get<std::string>());
  }
  EXPECT_GE(distinct.size(), 2u);
  json oai = base;
  oai["n"] = 3;
  auto [ost, cmpl] = s.Post("/v1/completions", oai);
  ASSERT_EQ(ost, 200);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(cmpl["choices"][i]["text"], answers[i]["content"]);
}

// Assistant prefill in the native formats and in Jinja templates: the last assistant message is
// rendered open after the generation prompt.
TEST_F(ServerTest, AssistantPrefillInEveryTemplate) {
  const json messages = {{{"role", "system"}, {"content", "S"}},
                         {{"role", "user"}, {"content", "U"}},
                         {{"role", "assistant"}, {"content", "1\n2\n3"}}};
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--chat-template", "llama3"},
       "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|><|start_header_id|>assistant<|end_"
       "header_id|>\n\n1\n2\n3"},
      {{"--chat-template", "qwen3"},
       "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n1\n2\n3"},
      {{"--chat-template", "qwen3", "--reasoning", "off"},
       "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n1\n2\n3"},
      {{"--chat-template", "gemma"},
       "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n1\n2\n3"},
      {{"--chat-template", "phi3"}, "<|user|>\nU<|end|>\n<|assistant|>\n1\n2\n3"},
      {{"--jinja"}, "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n1\n2\n3"},
      {{"--chat-template", "gpt-oss"},
       "<|start|>user<|message|>U<|end|><|start|>assistant<|channel|>final<|message|>1\n2\n3"},
  };
  for (const auto& [flags, tail] : cases) {
    std::vector<std::string> args = {"-m", kShipped, "-c", "512"};
    args.insert(args.end(), flags.begin(), flags.end());
    ServerProcess s(args);
    ASSERT_TRUE(s.healthy()) << s.Log();
    auto [st, r] = s.Post("/apply-template", {{"messages", messages}});
    ASSERT_EQ(st, 200) << r.dump();
    EXPECT_TRUE(r["prompt"].get<std::string>().ends_with(tail)) << flags.back() << ": " << r.dump();
  }
  // --no-prefill-assistant: a finished turn unless the request asks to continue it.
  ServerProcess s({"-m", kShipped, "-c", "512", "--no-prefill-assistant"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  auto [st, closed] = s.Post("/apply-template", {{"messages", messages}});
  EXPECT_TRUE(
      closed["prompt"].get<std::string>().ends_with("1\n2\n3<|im_end|>\n<|im_start|>assistant\n"))
      << closed.dump();
  auto [ot, open] =
      s.Post("/apply-template", {{"messages", messages}, {"continue_final_message", true}});
  EXPECT_TRUE(open["prompt"].get<std::string>().ends_with("<|im_start|>assistant\n1\n2\n3"))
      << open.dump();
}

// Tool calling on /v1/chat/completions: tools in the prompt, tool_choice "required" and a named
// function forcing a parseable call out of the shipped model (which knows no tools), the
// non-streaming and streaming shapes, "auto" leaving plain answers alone, and the 400s.
TEST_F(ServerTest, ToolCalls) {
  ServerProcess s({"-m", kShipped, "-c", "2048", "-np", "2"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json weather = {
      {"type", "function"},
      {"function",
       {{"name", "get_weather"},
        {"description", "The weather of a city"},
        {"parameters",
         {{"type", "object"},
          {"properties", {{"city", {{"type", "string"}, {"enum", {"Paris", "Oslo"}}}}}},
          {"required", {"city"}}}}}}};
  const json clock = {{"type", "function"},
                      {"function",
                       {{"name", "get_time"},
                        {"parameters",
                         {{"type", "object"},
                          {"properties", {{"utc", {{"type", "boolean"}}}}},
                          {"required", {"utc"}}}}}}};
  const json tools = {weather, clock};
  const json ask = {{{"role", "user"}, {"content", "What is the weather in Paris?"}}};

  // The template gets the tools, the assistant's calls and the tool's answer.
  const json history = {
      {{"role", "user"}, {"content", "Weather in Paris?"}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "call_1"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\":\"Paris\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "21 C"}}};
  auto [at, applied] = s.Post("/apply-template", {{"messages", history}, {"tools", tools}});
  ASSERT_EQ(at, 200) << applied.dump();
  const std::string prompt = applied["prompt"];
  // (This test's JSON sorts keys; the server keeps the order it is sent.)
  EXPECT_NE(prompt.find("<tools>\n{\"function\": {\"description\": \"The weather of a city\", "
                        "\"name\": \"get_weather\""),
            std::string::npos)
      << prompt;
  EXPECT_NE(prompt.find("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
                        "\"arguments\": {\"city\": \"Paris\"}}\n</tool_call><|im_end|>\n"
                        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n"
                        "<|im_start|>assistant\n"),
            std::string::npos)
      << prompt;
  auto [nt, none] =
      s.Post("/apply-template", {{"messages", ask}, {"tools", tools}, {"tool_choice", "none"}});
  ASSERT_EQ(nt, 200);
  EXPECT_EQ(none["prompt"].get<std::string>().find("<tools>"), std::string::npos);

  // tool_choice "required": a call to an offered tool with arguments of its schema.
  auto check_call = [](const json& call, const std::string& name) {
    EXPECT_TRUE(call["id"].get<std::string>().starts_with("call_")) << call.dump();
    EXPECT_EQ(call["type"], "function");
    EXPECT_EQ(call["function"]["name"], name) << call.dump();
    const json args = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
    ASSERT_TRUE(args.is_object()) << call.dump();
    if (name == "get_weather") {
      EXPECT_TRUE(args["city"] == "Paris" || args["city"] == "Oslo") << args.dump();
    } else {
      EXPECT_TRUE(args["utc"].is_boolean()) << args.dump();
    }
  };
  json body = {{"messages", ask},
               {"tools", tools},
               {"tool_choice", "required"},
               {"temperature", 0},
               {"max_tokens", 200}};
  auto [st, r] = s.Post("/v1/chat/completions", body);
  ASSERT_EQ(st, 200) << r.dump();
  const json& choice = r["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls") << r.dump();
  EXPECT_TRUE(choice["message"]["content"].is_null()) << r.dump();
  ASSERT_EQ(choice["message"]["tool_calls"].size(), 1u) << r.dump();
  const std::string forced_name = choice["message"]["tool_calls"][0]["function"]["name"];
  check_call(choice["message"]["tool_calls"][0], forced_name);

  // A named function.
  for (const std::string name : {"get_time", "get_weather"}) {
    json named = body;
    named["tool_choice"] = {{"type", "function"}, {"function", {{"name", name}}}};
    auto [nst, nr] = s.Post("/v1/chat/completions", named);
    ASSERT_EQ(nst, 200) << nr.dump();
    EXPECT_EQ(nr["choices"][0]["finish_reason"], "tool_calls") << nr.dump();
    ASSERT_EQ(nr["choices"][0]["message"]["tool_calls"].size(), 1u) << nr.dump();
    check_call(nr["choices"][0]["message"]["tool_calls"][0], name);
  }

  // Streaming: no tag text in content deltas, one tool_calls delta with index, id, type, name
  // and the whole arguments, then finish_reason "tool_calls".
  json sbody = body;
  sbody["stream"] = true;
  httplib::Client c = s.Client();
  auto sr = c.Post("/v1/chat/completions", sbody.dump(), "application/json");
  ASSERT_TRUE(sr && sr->status == 200);
  std::string content;
  std::vector<json> deltas;
  json finish;
  for (const json& e : SseEvents(sr->body)) {
    ASSERT_EQ(e["object"], "chat.completion.chunk") << e.dump();
    const json& ch = e["choices"][0];
    if (ch["delta"].contains("content") && ch["delta"]["content"].is_string()) {
      content += ch["delta"]["content"].get<std::string>();
    }
    if (ch["delta"].contains("tool_calls")) {
      for (const json& d : ch["delta"]["tool_calls"]) deltas.push_back(d);
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(content.find("<tool_call>"), std::string::npos) << content;
  EXPECT_EQ(finish, "tool_calls") << sr->body;
  ASSERT_EQ(deltas.size(), 1u) << sr->body;
  EXPECT_EQ(deltas[0]["index"], 0);
  check_call(deltas[0], forced_name);
  // Greedy: the same call as the non-streaming answer.
  EXPECT_EQ(deltas[0]["function"]["arguments"],
            choice["message"]["tool_calls"][0]["function"]["arguments"]);

  // parallel_tool_calls with "required": one call or more, each a valid one.
  json par = body;
  par["parallel_tool_calls"] = true;
  auto [pst, pr] = s.Post("/v1/chat/completions", par);
  ASSERT_EQ(pst, 200) << pr.dump();
  if (pr["choices"][0]["finish_reason"] == "tool_calls") {
    for (const json& call : pr["choices"][0]["message"]["tool_calls"]) {
      check_call(call, call["function"]["name"]);
    }
  } else {
    EXPECT_EQ(pr["choices"][0]["finish_reason"], "length") << pr.dump();  // calls until the budget
  }

  // "auto": the model counts as it always does (past 6: the tools prompt is new to it); plain
  // content, no tool_calls, streamed alike.
  json counting = {{"messages", {{{"role", "user"}, {"content", "Count from 1 to 6."}}}},
                   {"tools", tools},
                   {"temperature", 0},
                   {"max_tokens", 60}};
  auto [ast, ar] = s.Post("/v1/chat/completions", counting);
  ASSERT_EQ(ast, 200) << ar.dump();
  EXPECT_NE(ar["choices"][0]["finish_reason"], "tool_calls") << ar.dump();
  EXPECT_FALSE(ar["choices"][0]["message"].contains("tool_calls")) << ar.dump();
  const std::string answer = ar["choices"][0]["message"]["content"];
  EXPECT_FALSE(answer.empty());
  counting["stream"] = true;
  auto as = c.Post("/v1/chat/completions", counting.dump(), "application/json");
  ASSERT_TRUE(as && as->status == 200);
  std::string streamed;
  for (const json& e : SseEvents(as->body)) {
    const json& d = e["choices"][0]["delta"];
    if (d.contains("content") && d["content"].is_string()) streamed += d["content"];
    EXPECT_FALSE(d.contains("tool_calls")) << e.dump();
  }
  EXPECT_EQ(streamed, answer);

  // Untrusted input: clear 400s.
  json many = json::array();
  for (int i = 0; i < 129; ++i) {
    json t = weather;
    t["function"]["name"] = "f" + std::to_string(i);
    many.push_back(t);
  }
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"tools", "get_weather"}}, "\"tools\" must be an array"},
      {{{"tools", {42}}}, "tools[0] must be an object"},
      {{{"tools", {{{"type", "function"}}}}}, "tools[0].function must be an object"},
      {{{"tools", {{{"type", "function"}, {"function", {{"name", "a b"}}}}}}},
       "tools[0].function.name must be"},
      {{{"tools", {{{"type", "retrieval"}, {"function", {{"name", "a"}}}}}}},
       "tools[0].type must be \"function\""},
      {{{"tools", {weather, weather}}}, "given twice"},
      {{{"tools", many}}, "more than 128 tools"},
      {{{"tools", tools}, {"tool_choice", "always"}}, "\"tool_choice\" must be"},
      {{{"tools", tools}, {"tool_choice", 3}}, "\"tool_choice\" must be"},
      {{{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "x"}}}}}},
       "not in \"tools\""},
      {{{"tool_choice", "required"}}, "needs \"tools\""},
      {{{"tools", tools}, {"parallel_tool_calls", "yes"}}, "must be a boolean"},
      {{{"tools", tools}, {"tool_choice", "required"}, {"grammar", "root ::= \"x\""}},
       "cannot be combined"},
      {{{"messages", {{{"role", "user"}, {"content", "x"}, {"tool_calls", json::array()}}}}},
       "only assistant turns have tool_calls"},
      {{{"messages",
         {{{"role", "assistant"},
           {"tool_calls", {{{"function", {{"name", "f"}, {"arguments", 5}}}}}}}}}},
       "arguments must be a string (JSON) or an object"},
      {{{"messages", {{{"role", "assistant"}, {"tool_calls", {{{"type", "function"}}}}}}}},
       "function must be an object"},
      {{{"messages", {{{"role", "tool"}, {"content", "x"}, {"tool_call_id", 7}}}}},
       "tool_call_id must be a string"},
  };
  for (const auto& [extra, want] : bad) {
    json b = {{"messages", ask}, {"max_tokens", 4}};
    for (const auto& [k, v] : extra.items()) b[k] = v;
    auto [bst, br] = s.Post("/v1/chat/completions", b);
    EXPECT_EQ(bst, 400) << extra.dump() << " " << br.dump();
    EXPECT_EQ(br["error"]["code"], 400) << br.dump();
    EXPECT_EQ(br["error"]["type"], "invalid_request_error") << br.dump();
    EXPECT_NE(br["error"]["message"].get<std::string>().find(want), std::string::npos)
        << extra.dump() << " " << br.dump();
  }
  // Deeply nested tool parameters are refused, not recursed into.
  json deep = json::object();
  for (int i = 0; i < 200; ++i) deep = {{"type", "object"}, {"properties", {{"a", deep}}}};
  json dt = weather;
  dt["function"]["parameters"] = deep;
  auto [dst, dr] = s.Post("/v1/chat/completions", {{"messages", ask}, {"tools", {dt}}});
  EXPECT_EQ(dst, 400) << dr.dump();
  // The server is still serving.
  auto [hst, hr] = s.Get("/health");
  EXPECT_EQ(hst, 200);
}

// The built-in llama3 format renders no tools: a clear 400 (the --jinja template may).
TEST_F(ServerTest, ToolsRefusedByTheLlama3Builtin) {
  ServerProcess s({"-m", kShipped, "-c", "512", "--chat-template", "llama3"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json weather = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  auto [st, r] =
      s.Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                      {"tools", {weather}},
                                      {"max_tokens", 4}});
  EXPECT_EQ(st, 400) << r.dump();
  EXPECT_NE(r["error"]["message"].get<std::string>().find("--jinja"), std::string::npos)
      << r.dump();
}

// Tool calls parsed from each format, the output pinned by a grammar under tool_choice "auto":
// content beside the calls, streamed text held back from a call's opener on, a malformed call
// and a JSON answer naming no tool left as content.
// gpt-oss's harmony answers (--chat-template gpt-oss; the answers forced by a grammar): the
// analysis channel comes back as reasoning_content, the final channel as content, a message to
// functions.NAME as a tool call, whole and streamed.
TEST_F(ServerTest, HarmonyAnswersWithTheGptOssTemplate) {
  ServerProcess s({"-m", kShipped, "-c", "2048", "--chat-template", "gpt-oss"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json tools = {{{"type", "function"},
                       {"function",
                        {{"name", "get_time"},
                         {"description", "The time"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"tz", {{"type", "string"}, {"enum", {"UTC", "CET"}}}}}},
                           {"required", {"tz"}},
                           {"additionalProperties", false}}}}}}};
  auto gbnf = [](const std::string& text) { return "root ::= " + json(text).dump(); };
  struct Case {
    std::string output;
    std::string reasoning, content;
    std::string call, args;  // none when call is empty
  };
  const std::vector<Case> cases = {
      {"<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final"
       "<|message|>Hello there.",
       "User greets.", "Hello there.", "", ""},
      {"<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>"
       "commentary to=functions.get_time <|constrain|>json<|message|>{\"tz\": \"UTC\"}",
       "Need the time.", "", "get_time", "{\"tz\":\"UTC\"}"},
  };
  httplib::Client c = s.Client();
  for (const Case& k : cases) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                 {"tools", tools},
                 {"grammar", gbnf(k.output)},
                 {"temperature", 0},
                 {"max_tokens", 300}};
    auto [st, r] = s.Post("/v1/chat/completions", body);
    ASSERT_EQ(st, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    EXPECT_EQ(m.value("reasoning_content", ""), k.reasoning) << r.dump();
    if (k.call.empty()) {
      EXPECT_EQ(m["content"], k.content) << r.dump();
      EXPECT_EQ(r["choices"][0]["finish_reason"], "stop") << r.dump();
    } else {
      ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
      EXPECT_EQ(m["tool_calls"][0]["function"]["name"], k.call);
      EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"], k.args);
      EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
    }
    body["stream"] = true;
    auto sr = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(sr && sr->status == 200);
    std::string reasoning, content, finish;
    std::vector<json> calls;
    for (const json& e : SseEvents(sr->body)) {
      const json& ch = e["choices"][0];
      const json& d = ch["delta"];
      if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
      if (d.contains("content") && d["content"].is_string()) {
        content += d["content"].get<std::string>();
      }
      if (d.contains("tool_calls")) calls.push_back(d["tool_calls"][0]);
      if (ch["finish_reason"].is_string()) finish = ch["finish_reason"];
    }
    EXPECT_EQ(reasoning, k.reasoning) << sr->body;
    EXPECT_EQ(content, k.content) << sr->body;
    ASSERT_EQ(calls.size(), k.call.empty() ? 0u : 1u) << sr->body;
    if (!k.call.empty()) {
      EXPECT_EQ(calls[0]["function"]["name"], k.call);
      EXPECT_EQ(calls[0]["function"]["arguments"], k.args);
    }
    EXPECT_EQ(finish, k.call.empty() ? "stop" : "tool_calls") << sr->body;
  }
  // A forced call (required, or the named tool) is written in the harmony form and read back
  // as a call whose arguments are a JSON object.
  for (const json& choice :
       {json("required"), json{{"type", "function"}, {"function", {{"name", "get_time"}}}}}) {
    json forced = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                   {"tools", tools},
                   {"tool_choice", choice},
                   {"max_tokens", 200}};
    auto [st, r] = s.Post("/v1/chat/completions", forced);
    ASSERT_EQ(st, 200) << r.dump();
    const json& m = r["choices"][0]["message"];
    ASSERT_EQ(m["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_time") << r.dump();
    EXPECT_TRUE(
        json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()).is_object())
        << r.dump();
    EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls") << r.dump();
  }
}

// gpt-oss's harmony answers on the other routes (the gpt-oss fixture, random weights; the answers
// pinned by a forced call's grammar or a JSON format): Anthropic's tool_use block, the Responses
// function_call item, Ollama's content, each streamed and whole alike (the parts joined), with no
// harmony marker shown. The channels' mapping itself: harmony_routes_test.
TEST_F(ServerTest, HarmonyAnswersOnEveryRoute) {
  using lamina::testing_util::RouteKind;
  using lamina::testing_util::RouteParts;
  const std::string model =
      std::string(LAMINA_SOURCE_DIR) + "/tests/fixtures/models/synth-gpt-oss-d256.MXFP4_MOE.gguf";
  ServerProcess s({"-m", model, "-c", "2048", "--chat-template", "gpt-oss"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json schema = {{"type", "object"},
                       {"properties", {{"tz", {{"type", "string"}, {"enum", {"UTC", "CET"}}}}}},
                       {"required", {"tz"}},
                       {"additionalProperties", false}};
  const json user = {{{"role", "user"}, {"content", "hi"}}};
  struct Case {
    RouteKind kind;
    std::string path;
    json body;
    bool call;  // the answer is one get_time call, else JSON content
  };
  const std::vector<Case> cases = {
      {RouteKind::kAnthropic,
       "/v1/messages",
       {{"max_tokens", 300},
        {"temperature", 0},
        {"messages", user},
        {"tools", {{{"name", "get_time"}, {"description", "The time"}, {"input_schema", schema}}}},
        {"tool_choice", {{"type", "any"}}}},
       true},
      {RouteKind::kResponses,
       "/v1/responses",
       {{"max_output_tokens", 300},
        {"temperature", 0},
        {"input", "hi"},
        {"tools",
         {{{"type", "function"},
           {"name", "get_time"},
           {"description", "The time"},
           {"parameters", schema}}}},
        {"tool_choice", "required"}},
       true},
      {RouteKind::kResponses,
       "/v1/responses",
       {{"max_output_tokens", 300},
        {"temperature", 0},
        {"input", "hi"},
        {"text", {{"format", {{"type", "json_schema"}, {"name", "t"}, {"schema", schema}}}}}},
       false},
      {RouteKind::kOllamaChat,
       "/api/chat",
       {{"messages", user},
        {"format", schema},
        {"options", {{"temperature", 0}, {"num_predict", 300}}}},
       false},
      {RouteKind::kOllamaGenerate,
       "/api/generate",
       {{"prompt", "hi"},
        {"format", schema},
        {"options", {{"temperature", 0}, {"num_predict", 300}}}},
       false},
  };
  httplib::Client c = s.Client();
  for (const Case& k : cases) {
    json body = k.body;
    body["stream"] = false;
    auto [st, r] = s.Post(k.path, body);
    ASSERT_EQ(st, 200) << k.path << ": " << r.dump();
    const RouteParts whole = lamina::testing_util::WholeParts(k.kind, r);
    EXPECT_FALSE(lamina::testing_util::ShowsMarkers(whole)) << r.dump();
    EXPECT_EQ(whole.reasoning, "") << r.dump();
    if (k.call) {
      ASSERT_EQ(whole.calls.size(), 1u) << r.dump();
      EXPECT_EQ(whole.calls[0].first, "get_time");
      EXPECT_TRUE(json::parse(whole.calls[0].second).contains("tz")) << r.dump();
      EXPECT_EQ(whole.content, "") << r.dump();
    } else {
      EXPECT_TRUE(whole.calls.empty()) << r.dump();
      EXPECT_TRUE(json::parse(whole.content, nullptr, false).contains("tz")) << r.dump();
    }
    body["stream"] = true;
    auto sr = c.Post(k.path, body.dump(), "application/json");
    ASSERT_TRUE(sr && sr->status == 200) << k.path;
    const RouteParts streamed = lamina::testing_util::StreamParts(k.kind, sr->body);
    EXPECT_EQ(streamed, whole) << k.path << "\n"
                               << lamina::testing_util::DumpParts(streamed) << "\n"
                               << lamina::testing_util::DumpParts(whole) << "\n"
                               << sr->body;
  }
}

TEST_F(ServerTest, ToolCallsParsedFromEveryFormat) {
  ServerProcess s({"-m", kShipped, "-c", "2048"});
  ASSERT_TRUE(s.healthy()) << s.Log();
  const json tools = {{{"type", "function"},
                       {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}},
                      {{"type", "function"}, {"function", {{"name", "get_time"}}}}};
  auto gbnf = [](const std::string& text) { return "root ::= " + json(text).dump(); };
  struct Case {
    std::string output;
    json content;  // the non-streaming content
    std::vector<std::pair<std::string, std::string>> calls;
    std::string streamed;  // streamed content
  };
  const std::vector<Case> cases = {
      {"Sure. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
       "</tool_call>",
       "Sure.",
       {{"get_weather", "{\"city\":\"Oslo\"}"}},
       "Sure. "},
      {"<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": "
       "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}</tool_call>",
       nullptr,
       {{"get_time", "{}"}, {"get_weather", "{\"city\":\"Paris\"}"}},
       ""},
      {"{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}",
       nullptr,
       {{"get_time", "{\"tz\":\"UTC\"}"}},
       ""},
      {"[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}]",
       nullptr,
       {{"get_weather", "{\"city\":\"Rome\"}"}},
       ""},
      {"Hmm <tool_call>{\"name\": \"get_time\", \"arguments\": {]}</tool_call>",
       "Hmm <tool_call>{\"name\": \"get_time\", \"arguments\": {]}</tool_call>",
       {},
       "Hmm <tool_call>{\"name\": \"get_time\", \"arguments\": {]}</tool_call>"},
      {"{\"name\": \"someone\", \"age\": 3}",
       "{\"name\": \"someone\", \"age\": 3}",
       {},
       "{\"name\": \"someone\", \"age\": 3}"},
  };
  httplib::Client c = s.Client();
  for (const Case& k : cases) {
    json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                 {"tools", tools},
                 {"grammar", gbnf(k.output)},
                 {"temperature", 0},
                 {"max_tokens", 300}};
    auto [st, r] = s.Post("/v1/chat/completions", body);
    ASSERT_EQ(st, 200) << r.dump();
    const json& ch = r["choices"][0];
    EXPECT_EQ(ch["message"]["content"], k.content) << k.output << "\n" << r.dump();
    EXPECT_EQ(ch["finish_reason"], k.calls.empty() ? "stop" : "tool_calls") << r.dump();
    if (k.calls.empty()) {
      EXPECT_FALSE(ch["message"].contains("tool_calls")) << r.dump();
    } else {
      ASSERT_EQ(ch["message"]["tool_calls"].size(), k.calls.size()) << r.dump();
      for (size_t i = 0; i < k.calls.size(); ++i) {
        EXPECT_EQ(ch["message"]["tool_calls"][i]["function"]["name"], k.calls[i].first);
        EXPECT_EQ(ch["message"]["tool_calls"][i]["function"]["arguments"], k.calls[i].second);
      }
    }
    // Streamed: the content deltas, then one tool_calls delta per call in order.
    body["stream"] = true;
    auto sr = c.Post("/v1/chat/completions", body.dump(), "application/json");
    ASSERT_TRUE(sr && sr->status == 200);
    std::string streamed;
    std::vector<json> deltas;
    json finish;
    for (const json& e : SseEvents(sr->body)) {
      const json& d = e["choices"][0]["delta"];
      if (d.contains("content") && d["content"].is_string()) {
        EXPECT_TRUE(deltas.empty()) << "content after a tool call: " << sr->body;
        streamed += d["content"].get<std::string>();
      }
      if (d.contains("tool_calls")) deltas.push_back(d["tool_calls"][0]);
      if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(streamed, k.streamed) << sr->body;
    EXPECT_EQ(finish, k.calls.empty() ? "stop" : "tool_calls") << sr->body;
    ASSERT_EQ(deltas.size(), k.calls.size()) << sr->body;
    for (size_t i = 0; i < k.calls.size(); ++i) {
      EXPECT_EQ(deltas[i]["index"], i);
      EXPECT_EQ(deltas[i]["type"], "function");
      EXPECT_TRUE(deltas[i]["id"].get<std::string>().starts_with("call_"));
      EXPECT_EQ(deltas[i]["function"]["name"], k.calls[i].first);
      EXPECT_EQ(deltas[i]["function"]["arguments"], k.calls[i].second);
    }
  }
  // tool_choice "none": the same output is plain content.
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
               {"tools", tools},
               {"tool_choice", "none"},
               {"grammar", gbnf(cases[0].output)},
               {"temperature", 0},
               {"max_tokens", 300}};
  auto [st, r] = s.Post("/v1/chat/completions", body);
  ASSERT_EQ(st, 200) << r.dump();
  EXPECT_EQ(r["choices"][0]["message"]["content"], cases[0].output);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
}
