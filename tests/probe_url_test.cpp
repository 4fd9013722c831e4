// `lamina probe --url` as a real process: against an in-process fake OpenAI server (no /tokenize:
// token counts estimated; request fields, the API key, stop rules applied to finished answers,
// HTTP errors surfacing as failures, usage errors) and against a real `lamina serve` child
// process, whose answers must be the local engine's answers.
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
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "process_util.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kBinary = LAMINA_BINARY;
const std::string kShippedModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";

lamina::testing_util::ProcessOutput Shell(const std::string& cmd) {
  return lamina::testing_util::RunShell(cmd);
}

std::string TempDir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() /
                       ("lamina_probe_url_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// A loopback port nobody listens on right now.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    ::close(fd);
    return -1;
  }
  ::close(fd);
  return ntohs(addr.sin_port);
}

// An OpenAI-shaped chat endpoint that answers the probe's four tasks correctly, without
// /tokenize (so the probe estimates token counts), behind an API key.
class FakeServer {
 public:
  explicit FakeServer(bool fail_chat = false) : fail_chat_(fail_chat) {
    auto authorized = [](const httplib::Request& req) {
      return req.get_header_value("Authorization") == "Bearer sekret";
    };
    server_.Get("/v1/models", [authorized](const httplib::Request& req, httplib::Response& res) {
      if (!authorized(req)) {
        res.status = 401;
        res.set_content(R"({"error":{"message":"Invalid API Key"}})", "application/json");
        return;
      }
      res.set_content(R"({"object":"list","data":[{"id":"fake-model"}]})", "application/json");
    });
    server_.Post("/v1/chat/completions", [this, authorized](const httplib::Request& req,
                                                            httplib::Response& res) {
      const json body = json::parse(req.body);
      {
        std::lock_guard<std::mutex> lock(mu_);
        requests_.push_back(body);
        if (!authorized(req)) unauthorized_ = true;
      }
      if (fail_chat_) {
        res.status = 500;
        res.set_content(R"({"error":{"message":"the slot exploded"}})", "application/json");
        return;
      }
      const std::string user = body["messages"][0]["content"];
      json reply = {
          {"object", "chat.completion"},
          {"choices", json::array({{{"index", 0},
                                    {"message", {{"role", "assistant"}, {"content", Answer(body)}}},
                                    {"finish_reason", "stop"}}})},
          {"usage",
           {{"prompt_tokens", 5 + static_cast<int>(user.size()) / 4},
            {"completion_tokens", 7},
            {"total_tokens", 12 + static_cast<int>(user.size()) / 4}}}};
      res.set_content(reply.dump(), "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 200 && !server_.is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<json> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  bool unauthorized() const { return unauthorized_; }

 private:
  // The right answer to each of the probe's prompts; a newline and more text after the needle's
  // answer, which the probe's stop rule must cut. With thinking on (the template's
  // enable_thinking), a thought and </think> first, left in the content.
  static std::string Answer(const json& body) {
    if (body["max_tokens"] == 1) return "x";  // the token-count calibration
    if (body.contains("chat_template_kwargs") &&
        body["chat_template_kwargs"].value("enable_thinking", false)) {
      json plain = body;
      plain.erase("chat_template_kwargs");
      std::string out = "I do what I am asked.\n</think>\n\n";
      out += Answer(plain);
      return out;
    }
    const std::string user = body["messages"][0]["content"];
    std::smatch m;
    if (std::regex_search(user, m, std::regex(R"(^Count down from (\d+) to 1, one number)"))) {
      std::string out;
      for (int i = std::stoi(m[1]); i >= 1; --i) {
        out += std::to_string(i);
        if (i > 1) out += "\n";
      }
      return out;
    }
    if (std::regex_search(user, m,
                          std::regex(R"(^Count from 1 to (\d+), one number per line\.)"))) {
      std::string out;
      for (int i = 1; i <= std::stoi(m[1]); ++i) {
        if (i > 1) out += "\n";
        out += std::to_string(i);
      }
      return out;
    }
    if (std::regex_search(user, m, std::regex(R"(The secret code is (\d+)\.)"))) {
      return "The secret code is " + m[1].str() + ".\nIt was hidden well.";
    }
    if (std::regex_search(user, m,
                          std::regex(R"re("name" = "(\w+)", "age" = (\d+), "city" = "(\w+)")re"))) {
      return "{\"name\": \"" + m[1].str() + "\", \"age\": " + m[2].str() + ", \"city\": \"" +
             m[3].str() + "\"}";
    }
    const std::string copy = "Repeat this list exactly, one item per line:\n";
    if (user.rfind(copy, 0) == 0) return user.substr(copy.size());
    return "I do not know.";
  }

  bool fail_chat_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = -1;
  mutable std::mutex mu_;
  std::vector<json> requests_;
  std::atomic<bool> unauthorized_{false};
};

const json& Probe(const json& report, const char* probe) {
  return report["legs"][0]["probes"][probe];
}

TEST(ProbeUrl, FakeServerPassesTheGenerationProbesAndLogitProbesAreNotApplicable) {
  FakeServer server;
  const std::string dir = TempDir("fake");
  // A trailing /v1 is dropped; the model name comes from /v1/models.
  const auto o = Shell(kBinary + " probe --url " + server.url() +
                       "/v1 --api-key sekret --count-to 12 --needle-lengths 64,96 "
                       "--needle-depths 10,90 --ctx 512 --out " +
                       dir + " 2>/dev/null");
  ASSERT_EQ(o.code, 0) << o.out;
  EXPECT_NE(o.out.find("fake-model@" + server.url() + "/v1 (ref)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("PASS 12/12"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("n/a (no logits)"), std::string::npos) << o.out;
  EXPECT_TRUE(fs::exists(dir + "/report.html"));

  const json r = ReadJson(dir + "/probe.json");
  EXPECT_EQ(r["model"], server.url() + "/v1");
  EXPECT_EQ(r["arch"], "remote");
  ASSERT_EQ(r["legs"].size(), 1u);
  EXPECT_TRUE(r["legs"][0]["bits_per_element"].is_null());
  EXPECT_EQ(Probe(r, "counting")["status"], "pass");
  EXPECT_TRUE(Probe(r, "counting")["ended_turn"].get<bool>());
  EXPECT_EQ(Probe(r, "needle")["status"], "pass");
  EXPECT_EQ(Probe(r, "needle")["cell"], "4/4");
  // The stop rule cut the answer where the code appeared, as a local generation stops there.
  const json& cell = Probe(r, "needle")["grid"][0];
  EXPECT_EQ(cell["answer"], "The secret code is " + cell["expected"].get<std::string>());
  EXPECT_EQ(Probe(r, "json")["cell"], "valid 4/4, exact 4/4");
  EXPECT_EQ(Probe(r, "copy")["cell"], "exact 3/3");
  EXPECT_EQ(Probe(r, "thinking")["status"], "pass") << Probe(r, "thinking").dump();
  EXPECT_EQ(Probe(r, "thinking")["cell"], "right 3/3");
  EXPECT_EQ(Probe(r, "thinking")["items"][0]["thought"], "I do what I am asked.");
  for (const char* p : {"prefill", "divergence"}) {
    EXPECT_EQ(Probe(r, p)["status"], "n/a") << p;
    EXPECT_NE(Probe(r, p)["reason"].get<std::string>().find("logits"), std::string::npos) << p;
  }
  EXPECT_EQ(r["legs"][0]["verdict"], "pass");

  // Every request: greedy, a budget, the model named, the key sent. Without /tokenize the
  // counting budget is the expected text's bytes (a bound for any tokenizer) plus the slack.
  const std::vector<json> requests = server.requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_FALSE(server.unauthorized());
  bool saw_calibration = false, saw_count = false, saw_thinking = false;
  for (const json& q : requests) {
    EXPECT_EQ(q["temperature"], 0) << q.dump();
    EXPECT_EQ(q["model"], "fake-model") << q.dump();
    EXPECT_EQ(q["stream"], false) << q.dump();
    EXPECT_GT(q["max_tokens"].get<int>(), 0) << q.dump();
    EXPECT_EQ(q["messages"].size(), 1u);
    EXPECT_EQ(q["messages"][0]["role"], "user");
    saw_calibration = saw_calibration || q["max_tokens"] == 1;
    // The thinking probe's requests: thinking on, the block left in the content.
    if (q.contains("chat_template_kwargs")) {
      saw_thinking = true;
      EXPECT_EQ(q["chat_template_kwargs"], json({{"enable_thinking", true}})) << q.dump();
      EXPECT_EQ(q["reasoning_format"], "none") << q.dump();
      continue;
    }
    EXPECT_FALSE(q.contains("reasoning_format")) << q.dump();
    const std::string user = q["messages"][0]["content"];
    if (user.rfind("Count from 1 to 12,", 0) == 0) {
      saw_count = true;
      EXPECT_EQ(q["max_tokens"], 27 + 16);  // "1\n" .. "12\n" is 27 bytes
    }
  }
  EXPECT_TRUE(saw_calibration);
  EXPECT_TRUE(saw_count);
  EXPECT_TRUE(saw_thinking);
  fs::remove_all(dir);
}

TEST(ProbeUrl, ServerErrorsFailTheLegAndBadUsageExitsTwo) {
  FakeServer failing(/*fail_chat=*/true);
  const std::string dir = TempDir("fail");
  const auto o =
      Shell(kBinary + " probe --url " + failing.url() +
            " --api-key sekret --probes counting,json --count-to 5 --out " + dir + " 2>/dev/null");
  EXPECT_EQ(o.code, 1) << o.out;
  const json r = ReadJson(dir + "/probe.json");
  EXPECT_EQ(Probe(r, "counting")["status"], "fail");
  EXPECT_NE(Probe(r, "counting")["reason"].get<std::string>().find("HTTP 500: the slot exploded"),
            std::string::npos);
  EXPECT_EQ(Probe(r, "json")["status"], "fail");
  EXPECT_EQ(r["legs"][0]["verdict"], "fail");
  fs::remove_all(dir);

  // A wrong key: the connection check fails (exit 1) and says why.
  const auto denied = Shell(kBinary + " probe --url " + failing.url() + " --probes copy 2>&1");
  EXPECT_EQ(denied.code, 1);
  EXPECT_NE(denied.out.find("HTTP 401: Invalid API Key"), std::string::npos) << denied.out;
  // Nobody listening: exit 1.
  const int port = FreePort();
  ASSERT_GT(port, 0);
  EXPECT_EQ(Shell(kBinary + " probe --url http://127.0.0.1:" + std::to_string(port) +
                  " --probes copy >/dev/null 2>&1")
                .code,
            1);
  // Not an HTTP URL, or options that only local legs have: exit 2.
  EXPECT_EQ(Shell(kBinary + " probe --url ftp://127.0.0.1 >/dev/null 2>&1").code, 2);
  for (const char* extra :
       {" --kv int8", " --kv-v-round stochastic", " --inject-fault 0:biased-v"}) {
    EXPECT_EQ(Shell(kBinary + " probe --url " + failing.url() + extra + " >/dev/null 2>&1").code, 2)
        << extra;
  }
}

// A child process, killed (SIGTERM, then SIGKILL) and reaped when this goes out of scope.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv, const std::string& log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      std::FILE* f = std::freopen(log.c_str(), "w", stderr);
      (void)f;
      std::freopen("/dev/null", "w", stdout);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
  }
  ~Child() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  // Whether the child has exited (reaped then).
  bool Exited() {
    if (::waitpid(pid_, nullptr, WNOHANG) != pid_) return false;
    pid_ = -1;
    return true;
  }

 private:
  pid_t pid_ = -1;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The real server: `lamina serve` on the shipped thinking model (the shipped model with its
// thinking mode, so the thinking probe has thoughts to compare). Greedy over an f16 cache with
// the same chat template, its answers must be the local engine's, cell for cell and byte for byte.
const std::string kThinkingModel =
    std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter-think.gguf";
TEST(ProbeUrl, LaminaServeAnswersLikeTheLocalEngine) {
  if (!fs::exists(kThinkingModel)) GTEST_SKIP() << "no thinking model (" << kThinkingModel << ")";
  const auto help = Shell(kBinary + " serve --help 2>&1");
  if (help.out.find("lamina serve") == std::string::npos) {
    GTEST_SKIP() << "lamina serve is not available: " << help.out.substr(0, help.out.find('\n'));
  }
  const int port = FreePort();
  ASSERT_GT(port, 0);
  const std::string dir = TempDir("serve");
  const std::string log = dir + "/serve.log";
  Child server({kBinary, "serve", "-m", kThinkingModel, "--port", std::to_string(port), "-c",
                "4096", "-np", "1", "-t", "2"},
               log);
  httplib::Client client("127.0.0.1", port);
  bool healthy = false;
  for (int i = 0; i < 600 && !healthy; ++i) {
    httplib::Result res = client.Get("/health");
    healthy = res && res->status == 200;
    if (!healthy) {
      ASSERT_FALSE(server.Exited()) << "lamina serve exited:\n" << ReadFile(log);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ASSERT_TRUE(healthy) << "lamina serve did not become healthy:\n" << ReadFile(log);

  const std::string args =
      " --probes counting,needle,json,copy,thinking --count-to 24 --needle-lengths 160"
      " --needle-depths 20,80 --ctx 1024 --out ";
  const auto remote = Shell(kBinary + " probe --url http://127.0.0.1:" + std::to_string(port) +
                            args + dir + "/remote 2>/dev/null");
  ASSERT_TRUE(remote.code == 0 || remote.code == 1) << remote.out;
  EXPECT_NE(remote.out.find("leg  kv / v-round"), std::string::npos) << remote.out;
  EXPECT_NE(remote.out.find("@http://127.0.0.1:" + std::to_string(port) + " (ref)"),
            std::string::npos)
      << remote.out;
  const auto local = Shell(kBinary + " probe -m " + kThinkingModel + " --kv f16 -t 2" + args + dir +
                           "/local 2>/dev/null");
  ASSERT_TRUE(local.code == 0 || local.code == 1) << local.out;

  const json r = ReadJson(dir + "/remote/probe.json");
  const json l = ReadJson(dir + "/local/probe.json");
  EXPECT_EQ(Probe(r, "counting")["status"], "pass") << Probe(r, "counting").dump();
  for (const char* p : {"counting", "needle", "json", "copy", "thinking"}) {
    EXPECT_EQ(Probe(r, p)["cell"], Probe(l, p)["cell"]) << p;
    EXPECT_EQ(Probe(r, p)["status"], Probe(l, p)["status"]) << p;
  }
  EXPECT_EQ(Probe(r, "counting")["text"], Probe(l, "counting")["text"]);
  EXPECT_EQ(Probe(r, "counting")["generated_tokens"], Probe(l, "counting")["generated_tokens"]);
  EXPECT_EQ(Probe(r, "needle")["grid"], Probe(l, "needle")["grid"]);
  EXPECT_EQ(Probe(r, "json")["items"], Probe(l, "json")["items"]);
  EXPECT_EQ(Probe(r, "copy")["items"], Probe(l, "copy")["items"]);
  // Thinking on over HTTP (chat_template_kwargs, reasoning_format "none"): the block comes back
  // in the content as the local engine generates it.
  EXPECT_EQ(Probe(r, "thinking")["status"], "pass") << Probe(r, "thinking").dump();
  EXPECT_EQ(Probe(r, "thinking")["items"], Probe(l, "thinking")["items"]);
  fs::remove_all(dir);
}

}  // namespace
