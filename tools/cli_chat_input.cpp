// `lamina chat`'s line reader and Ctrl-C flag: libedit on a terminal (emacs keys, ~/.editrc,
// history in ~/.lamina_history), plain lines otherwise.
#include "cli_chat_input.h"

#include <histedit.h>
#include <langinfo.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cwchar>
#include <iostream>

namespace lamina::cli {

namespace {

std::atomic<int> g_interrupt{0};
static_assert(std::atomic<int>::is_always_lock_free, "the SIGINT flag must be lock-free");

extern "C" void OnSigint(int) { g_interrupt.store(1, std::memory_order_relaxed); }

// Waits for a byte of stdin or Ctrl-C. 1: a byte in *c; 0: end of input; -1: interrupted (errno
// EINTR) or a read error. SIGINT is blocked except inside ppoll, so the flag cannot be set
// between its test and the wait.
int ReadByte(char* c) {
  sigset_t block, old;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, &old);
  int rc = -1;
  while (true) {
    if (InterruptPending()) {
      errno = EINTR;
      break;
    }
    pollfd pfd{STDIN_FILENO, POLLIN, 0};
    const int n = ppoll(&pfd, 1, nullptr, &old);
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    const ssize_t r = read(STDIN_FILENO, c, 1);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    rc = r < 0 ? -1 : static_cast<int>(r);
    break;
  }
  const int saved = errno;
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved;
  return rc;
}

// libedit's character reader (EL_GETCFN): one multibyte character of the locale's encoding.
int ReadWideChar(EditLine*, wchar_t* out) {
  char buf[MB_LEN_MAX];
  size_t n = 0;
  while (true) {
    char c;
    const int r = ReadByte(&c);
    if (r <= 0) return r;
    buf[n++] = c;
    mbstate_t state{};
    wchar_t wc = 0;
    const size_t k = std::mbrtowc(&wc, buf, n, &state);
    if (k == static_cast<size_t>(-2) && n < sizeof(buf)) continue;
    if (k == static_cast<size_t>(-1) || k == static_cast<size_t>(-2)) {
      n = 0;  // not a character of the encoding: dropped
      continue;
    }
    *out = wc;
    return 1;
  }
}

const char* Prompt(EditLine*) { return "> "; }

// UTF-8 input needs a UTF-8 LC_CTYPE: the environment's, else C.UTF-8.
void UseUtf8Ctype() {
  std::setlocale(LC_CTYPE, "");
  if (std::strcmp(nl_langinfo(CODESET), "UTF-8") != 0) std::setlocale(LC_CTYPE, "C.UTF-8");
}

}  // namespace

void BlockInterrupts() {
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
}

void InstallInterruptHandler() {
  struct sigaction sa {};
  sa.sa_handler = OnSigint;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // ppoll still returns EINTR; writes and waits carry on
  sigaction(SIGINT, &sa, nullptr);
  sigset_t unblock;
  sigemptyset(&unblock);
  sigaddset(&unblock, SIGINT);
  pthread_sigmask(SIG_UNBLOCK, &unblock, nullptr);
}

bool InterruptPending() { return g_interrupt.load(std::memory_order_relaxed) != 0; }

void ClearInterrupt() { g_interrupt.store(0, std::memory_order_relaxed); }

ChatInput::ChatInput(bool terminal) : terminal_(terminal) {
  if (!terminal_ || isatty(STDERR_FILENO) == 0) return;
  UseUtf8Ctype();
  el_ = el_init("lamina", stdin, stderr, stderr);
  if (el_ == nullptr) return;
  el_set(el_, EL_EDITOR, "emacs");
  el_set(el_, EL_PROMPT, Prompt);
  el_set(el_, EL_GETCFN, ReadWideChar);
  hist_ = history_init();
  if (hist_ != nullptr) {
    HistEvent ev;
    history(hist_, &ev, H_SETSIZE, 1000);
    history(hist_, &ev, H_SETUNIQUE, 1);
    el_set(el_, EL_HIST, history, hist_);
    if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
      history_path_ = std::string(home) + "/.lamina_history";
      history(hist_, &ev, H_LOAD, history_path_.c_str());  // best effort: absent the first time
    }
  }
  el_source(el_, nullptr);  // ~/.editrc (key bindings, vi mode), when there is one
}

ChatInput::~ChatInput() {
  if (hist_ != nullptr) history_end(hist_);
  if (el_ != nullptr) el_end(el_);
}

ChatInput::Status ChatInput::Read(std::string* line, bool* had_text) {
  *had_text = false;
  line->clear();
  if (el_ != nullptr) {
    int count = 0;
    const char* text = el_gets(el_, &count);
    if (text != nullptr && count > 0) {
      line->assign(text, static_cast<size_t>(count));
      while (!line->empty() && (line->back() == '\n' || line->back() == '\r')) line->pop_back();
      return Status::kLine;
    }
    if (InterruptPending()) {
      ClearInterrupt();
      const LineInfo* li = el_line(el_);
      *had_text = li != nullptr && li->lastchar != li->buffer;
      std::fputc('\n', stderr);
      return Status::kInterrupted;
    }
    std::fputc('\n', stderr);  // Ctrl-D leaves the cursor after the prompt
    return Status::kEof;
  }
  if (!terminal_) {
    if (!std::getline(std::cin, *line)) return Status::kEof;
    if (!line->empty() && line->back() == '\r') line->pop_back();
    return Status::kLine;
  }
  // A terminal without line editing (stderr redirected): the terminal's own line, read byte
  // by byte so that Ctrl-C is seen while waiting.
  std::fprintf(stderr, "> ");
  std::fflush(stderr);
  while (true) {
    char c;
    const int r = ReadByte(&c);
    if (r == 1) {
      if (c == '\n') break;
      line->push_back(c);
      continue;
    }
    if (r < 0 && InterruptPending()) {
      ClearInterrupt();
      *had_text = !line->empty();
      line->clear();
      std::fputc('\n', stderr);
      return Status::kInterrupted;
    }
    if (line->empty()) return Status::kEof;
    break;
  }
  if (!line->empty() && line->back() == '\r') line->pop_back();
  return Status::kLine;
}

void ChatInput::Remember(const std::string& line) {
  if (hist_ == nullptr || line.empty()) return;
  HistEvent ev;
  history(hist_, &ev, H_ENTER, line.c_str());
  if (!history_path_.empty()) history(hist_, &ev, H_SAVE, history_path_.c_str());
}

}  // namespace lamina::cli
