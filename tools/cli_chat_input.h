// The input side of `lamina chat`: the user's lines (libedit's line editing and history on a
// terminal, plain lines from a pipe) and Ctrl-C, which a signal handler records in a flag.
#pragma once

#include <string>

struct editline;
struct history;

namespace lamina::cli {

// Ctrl-C: once InstallInterruptHandler has run, SIGINT only sets a flag (async-signal-safe),
// which the generation loop polls between tokens and the line reader while it waits. Call
// BlockInterrupts before creating worker threads (they inherit the blocked signal) and
// InstallInterruptHandler after, from the main thread, which it unblocks: the signal then always
// lands in the thread that reads the terminal.
void BlockInterrupts();  // before creating worker threads
void InstallInterruptHandler();
bool InterruptPending();
void ClearInterrupt();

class ChatInput {
 public:
  enum class Status { kLine, kEof, kInterrupted };

  // terminal: stdin is a terminal (Ctrl-C is handled, a prompt is shown). Line editing and
  // the history in ~/.lamina_history are used when stderr is a terminal too.
  explicit ChatInput(bool terminal);
  ~ChatInput();
  ChatInput(const ChatInput&) = delete;
  ChatInput& operator=(const ChatInput&) = delete;

  // The next line without its end of line. kInterrupted: Ctrl-C while reading; *had_text tells
  // whether the discarded line held text.
  Status Read(std::string* line, bool* had_text);
  // Records a line in the history (and its file), when there is one.
  void Remember(const std::string& line);
  bool editing() const { return el_ != nullptr; }

 private:
  bool terminal_;
  editline* el_ = nullptr;
  history* hist_ = nullptr;
  std::string history_path_;
};

}  // namespace lamina::cli
