// A process saving session files is killed with SIGKILL at random points, many times; the file
// is always a complete session file: the one before the save in progress or the one it wrote.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "model/model.h"
#include "runtime/session_file.h"
#include "temp_path.h"
#include "util/mapped_file.h"
#include "util/timer.h"

namespace lamina {
namespace {

const std::string kModel = std::string(LAMINA_SOURCE_DIR) + "/models/lamina-counter.gguf";
constexpr int kTrials = 240;
constexpr int kTokens = 1000;  // f32 cells: ~5 MB per save

// Tokens the i-th save of the child holds (i = -1: the file before the first save).
int TokensOfSave(int i) { return kTokens - ((i + 1) % 64); }

TEST(SessionKill, AKilledSaveLeavesTheOldFileOrTheNewOne) {
  Result<std::unique_ptr<Model>> m = LoadModel(kModel);
  ASSERT_TRUE(m.ok()) << m.error().message;
  const Model& model = **m;
  const uint64_t hash = ModelIdentityHash(model);
  ThreadPool pool(1);
  SessionConfig sc;
  sc.n_ctx = kTokens;
  sc.kv_type = KvType::kF32;
  Session session(model, sc, pool);
  std::mt19937 rng(29);
  std::vector<int32_t> tokens(kTokens);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % model.hparams().n_vocab);
  ASSERT_TRUE(session.Eval(tokens, false).ok());
  const std::string dir = testing_util::UniqueTempPath("lamina_kill");
  const testing_util::RemoveAtExit remove_dir(dir);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string file = dir + "/state.session";
  // How long one save takes: kills land uniformly over three saves.
  const double t0 = NowSeconds();
  ASSERT_TRUE(SaveSessionFile(file, session, 0, hash).ok());
  const double save_s = NowSeconds() - t0;
  std::uniform_int_distribution<int> delay_us(0, std::max(200, static_cast<int>(3e6 * save_s)));

  int mid_save = 0;  // trials where a temporary file shows the kill came during a save
  // kTrials trials, more (up to 4x) while fewer than a quarter of the kills landed during a save:
  // on a loaded machine the saver may not have started its save yet when the kill comes.
  int trial = 0;
  for (; trial < kTrials || (mid_save < kTrials / 4 && trial < 4 * kTrials); ++trial) {
    session.Truncate(0, TokensOfSave(-1));
    ASSERT_TRUE(SaveSessionFile(file, session, 0, hash).ok());
    int done_pipe[2];
    ASSERT_EQ(pipe(done_pipe), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // the saving process: saves forever, one byte on the pipe after each
      close(done_pipe[0]);
      for (int i = 0;; ++i) {
        session.Truncate(0, TokensOfSave(i));
        if (!SaveSessionFile(file, session, 0, hash).ok()) _exit(1);
        const char b = 1;
        if (write(done_pipe[1], &b, 1) != 1) _exit(1);
      }
    }
    close(done_pipe[1]);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saver ended by itself";
    int completed = 0;
    char buf[256];
    for (ssize_t n; (n = read(done_pipe[0], buf, sizeof(buf))) > 0;)
      completed += static_cast<int>(n);
    close(done_pipe[0]);
    const std::string tmp = file + ".tmp." + std::to_string(pid);
    if (std::filesystem::exists(tmp)) {
      ++mid_save;
      std::filesystem::remove(tmp);
    }
    // The file parses completely and holds the state of the last completed save or of the one
    // in progress (the pipe may lag one save behind).
    Result<std::unique_ptr<MappedFile>> mapped = MappedFile::Open(file);
    ASSERT_TRUE(mapped.ok()) << mapped.error().message;
    Session target(model, sc, pool);
    Result<SessionFileView> view =
        ParseSessionFile((*mapped)->data(), (*mapped)->size(), target, hash);
    ASSERT_TRUE(view.ok()) << "trial " << trial << ": " << view.error().message;
    const int n = static_cast<int>(view->tokens.size());
    EXPECT_TRUE(n == TokensOfSave(completed - 1) || n == TokensOfSave(completed) ||
                n == TokensOfSave(completed + 1))
        << "trial " << trial << ": " << n << " tokens after " << completed << " saves";
    EXPECT_TRUE(std::equal(view->tokens.begin(), view->tokens.end(), tokens.begin()));
  }
  std::printf("%d trials, %d killed during a save (one save: %.2f ms)\n", trial, mid_save,
              1e3 * save_s);
  EXPECT_GE(mid_save, kTrials / 4) << "the kills should land during saves";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace lamina
