// Range checks for the numeric options of every subcommand (run, chat, score, bench, probe,
// serve) as CLI11 validators, so that one place says what each kind of number may be; a value
// out of range ends the parse with one line naming the option, the range and the value, and the
// bad-usage exit code (ParseErrorExit).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "value_ranges.h"

namespace lamina::cli {

// Threads may be at most this many times the machine's cores.
constexpr int kMaxThreadsPerCore = 4;

// 0 (all cores) .. kMaxThreadsPerCore x cores; a warning on stderr above the core count.
CLI::Validator Threads();
// A value in `range` (value_ranges.h: the rules the server's request fields share).
CLI::Validator InRange(const ValueRange& range);
// A finite number in [0, 1] (top-p, min-p).
CLI::Validator Probability();
// A finite number > 0 (penalties).
CLI::Validator Positive();
// A finite number >= 0 (scales, where 0 means "the model's").
CLI::Validator NonNegativeFinite();
// A finite temperature in [0, 100] (0: greedy).
CLI::Validator Temperature();
// An integer in [lo, hi] (counts: lo = 0).
CLI::Validator IntRange(int64_t lo, int64_t hi);
// A seed: an unsigned 64-bit integer.
CLI::Validator Seed();
// Context sizes: an integer in [0, 2^30] (0: the model's). Larger fit in no memory; what fits
// is the memory guard's call, which names the bytes.
CLI::Validator ContextSize();

// The exit code for a CLI11 parse error: help and version print as CLI11 prints them (exit 0);
// any other error prints one line "lamina: <what>" and returns the bad-usage code. An unknown
// long option names the closest known one ("did you mean '--temp'?").
int ParseErrorExit(const CLI::App& app, const CLI::ParseError& e);

// The name in `names` closest to `typed`: within a small edit distance (a swap of two neighbours
// counts once), or one a prefix of the other; "" when none is close.
std::string ClosestName(const std::string& typed, const std::vector<std::string>& names);

// The one-line error for the first argument of `args` (a subcommand's arguments, as the user
// typed them) that is a llama.cpp flag `cmd` does not take ("lamina: -cnv: use `lamina chat`
// ..."), or a one-dash word CLI11 would split into a short option and its value ("-tgs" as
// "-t gs"); "" when there is none.
std::string ForeignFlagError(const CLI::App& cmd, const std::vector<std::string>& args);

}  // namespace lamina::cli
