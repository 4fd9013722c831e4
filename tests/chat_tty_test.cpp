// `lamina chat` on a real terminal, driven through tmux: Ctrl-C stops an answer and the
// conversation goes on, /commands are not sent to the model, /bye, Ctrl-C twice at an empty
// prompt and Ctrl-D exit 0. Skips when tmux or the shipped model is absent.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const std::string kBinary = LAMINA_BINARY;

std::string ModelPath() {
  if (const char* env = std::getenv("LAMINA_TEST_MODEL"); env != nullptr && *env) return env;
  return std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
}

std::string Quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

bool IsNumber(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// One `lamina chat` in a detached tmux session on a private server, with HOME in a fresh
// folder (the history file lands there); its exit status is written to HOME/exit.
class ChatTty : public ::testing::Test {
 protected:
  void SetUp() override {
    if (lamina::testing_util::RunShell("command -v tmux").code != 0) {
      GTEST_SKIP() << "tmux is not installed";
    }
    if (!fs::exists(ModelPath())) GTEST_SKIP() << "no shipped model (" << ModelPath() << ")";
    char dir[] = "/tmp/lamina_chat_tty_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    home_ = dir;
    socket_ = "lamina-chat-test-" + std::to_string(getpid());
    const std::string chat = "HOME=" + Quote(home_) + " " + Quote(kBinary) + " chat -m " +
                             Quote(ModelPath()) + " -t 1 --temp 0 -n 2000; echo $? > " +
                             Quote(home_ + "/exit") + "; sleep 60";
    ASSERT_EQ(Tmux("new-session -d -x 200 -y 50 -s chat " + Quote(chat)), 0);
    ASSERT_TRUE(WaitFor([&] { return Screen().find("type /help") != std::string::npos; }, 30))
        << Screen();
  }

  void TearDown() override {
    if (!socket_.empty()) Tmux("kill-server");
    if (!home_.empty()) fs::remove_all(home_);
  }

  int Tmux(const std::string& args) {
    return lamina::testing_util::RunShell("env -u TMUX tmux -L " + socket_ + " " + args +
                                          " 2>/dev/null")
        .code;
  }
  void Type(const std::string& text) {
    Tmux("send-keys -t chat -l " + Quote(text));
    Tmux("send-keys -t chat Enter");
  }
  void Key(const std::string& key) { Tmux("send-keys -t chat " + key); }
  // The whole pane, scrollback included.
  std::string Screen() {
    return lamina::testing_util::RunShell("env -u TMUX tmux -L " + socket_ +
                                          " capture-pane -p -t chat -S - 2>/dev/null")
        .out;
  }
  static bool WaitFor(const std::function<bool()>& done, double seconds) {
    const auto end = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < end) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return done();
  }
  // The exit status written by the pane's shell; -1 while it runs (up to `seconds`).
  int WaitExit(double seconds) {
    int code = -1;
    WaitFor(
        [&] {
          std::ifstream in(home_ + "/exit");
          return static_cast<bool>(in >> code);
        },
        seconds);
    return code;
  }
  // True when the last line is an empty prompt.
  bool AtPrompt() {
    const std::vector<std::string> lines = Lines(Screen());
    return !lines.empty() && lines.back() == ">";
  }
  // The lines after the last line equal to `marker`.
  std::vector<std::string> After(const std::string& marker) {
    std::vector<std::string> lines = Lines(Screen());
    for (size_t i = lines.size(); i-- > 0;) {
      if (lines[i] == marker)
        return {lines.begin() + static_cast<std::ptrdiff_t>(i) + 1, lines.end()};
    }
    return {};
  }

  std::string home_;
  std::string socket_;
};

TEST_F(ChatTty, CtrlCStopsTheAnswerAndTheConversationGoesOn) {
  const std::string count300 = "Count from 1 to 300, one number per line.";
  Type(count300);
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string& l : After("> " + count300)) {
          if (IsNumber(l) && std::stoi(l) >= 10) return true;
        }
        return false;
      },
      30))
      << Screen();
  Key("C-c");
  ASSERT_TRUE(WaitFor([&] { return AtPrompt(); }, 10)) << Screen();
  const std::string stopped = Screen();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_EQ(Screen(), stopped) << "the answer went on after Ctrl-C";
  // The terminal echoes ^C where the answer was cut; the count (to 300 unstopped) ends early.
  int last = 0;
  bool echoed = false;
  for (const std::string& l : After("> " + count300)) {
    echoed = echoed || l.find("^C") != std::string::npos;
    const std::string digits = l.substr(0, l.find("^C"));
    if (IsNumber(digits)) last = std::max(last, std::stoi(digits));  // "1^C": 15 cut
  }
  EXPECT_TRUE(echoed) << stopped;
  EXPECT_GE(last, 10) << stopped;
  EXPECT_LT(last, 200) << stopped;

  const std::string count5 = "Count from 1 to 5, one number per line.";
  Type(count5);
  ASSERT_TRUE(WaitFor([&] { return After("> " + count5).size() >= 6 && AtPrompt(); }, 30))
      << Screen();
  EXPECT_EQ(After("> " + count5), (std::vector<std::string>{"1", "2", "3", "4", "5", ">"}));

  // /help lists the commands and is not sent to the model (no answer, the prompt comes back).
  Type("/help");
  ASSERT_TRUE(WaitFor([&] { return AtPrompt() && !After("> /help").empty(); }, 10)) << Screen();
  const std::vector<std::string> help = After("> /help");
  std::string joined;
  for (const std::string& l : help) joined += l + "\n";
  for (const char* cmd : {"/help", "/clear", "/save FILE", "/load FILE", "/bye"}) {
    EXPECT_NE(joined.find(cmd), std::string::npos) << cmd << "\n" << joined;
  }
  for (const std::string& l : help) EXPECT_FALSE(IsNumber(l)) << joined;

  Type("/nonsense");
  ASSERT_TRUE(WaitFor([&] { return AtPrompt() && !After("> /nonsense").empty(); }, 10));
  EXPECT_NE(After("> /nonsense")[0].find("unknown command /nonsense"), std::string::npos)
      << Screen();

  Type("/bye");
  EXPECT_EQ(WaitExit(10), 0) << Screen();
  std::ifstream history(home_ + "/.lamina_history");
  std::string saved((std::istreambuf_iterator<char>(history)), std::istreambuf_iterator<char>());
  EXPECT_NE(saved.find("/help"), std::string::npos) << saved;
}

TEST_F(ChatTty, CtrlCTwiceAtAnEmptyPromptExits) {
  Key("C-c");
  ASSERT_TRUE(WaitFor([&] { return Screen().find("press Ctrl-C again") != std::string::npos; }, 10))
      << Screen();
  EXPECT_EQ(WaitExit(0.3), -1) << "one Ctrl-C must not exit";
  Key("C-c");
  EXPECT_EQ(WaitExit(10), 0) << Screen();
}

TEST_F(ChatTty, CtrlDExits) {
  Key("C-d");
  EXPECT_EQ(WaitExit(10), 0) << Screen();
}

}  // namespace
