// Token sampling: greedy, or penalties (repetition, presence, frequency) → DRY → top-k →
// typical-p → top-p → min-p → XTC → temperature → a draw from a seeded RNG (llama.cpp's default
// chain, generator and draw: a seed gives llama.cpp's tokens for the same logits;
// SamplerConfig::samplers reorders the chain), or mirostat (temperature → mirostat, as
// llama.cpp). Deterministic for a seed; all state (RNGs, mirostat's mu) lives in the Sampler, so
// one sequence's draws never depend on another's.
// SampleWithDraft is the speculative-sampling step: it accepts a drafted token with
// probability min(1, p/q) and otherwise draws from the normalised residual max(0, p − q), so
// the emitted tokens follow the target distribution p whatever the draft.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

namespace lamina {

class Tokenizer;

// The steps of the chain, as llama-server names them in `samplers`.
enum class SamplerStage { kPenalties, kDry, kTopK, kTypicalP, kTopP, kMinP, kXtc, kTemperature };

// llama.cpp's default order: penalties, dry, top_k, typ_p, top_p, min_p, xtc, temperature.
const std::vector<SamplerStage>& DefaultSamplerStages();
// A stage by llama-server's name ("penalties", "dry", "top_k", "typ_p", "top_p", "min_p", "xtc",
// "temperature"; also "typical_p", "temp"); false for any other name.
bool SamplerStageFromName(const std::string& name, SamplerStage* out);
const char* SamplerStageName(SamplerStage stage);

// DRY sequence breakers: at most this many, each at most this many bytes (llama.cpp cuts a
// breaker at 40 bytes and its tail at 20 tokens).
inline constexpr size_t kMaxDryBreakers = 64;
inline constexpr size_t kMaxDryBreakerBytes = 40;
inline constexpr size_t kMaxDryBreakerTailTokens = 20;
// DRY looks back at most this many tokens (dry_penalty_last_n = -1: the history up to it).
inline constexpr int kMaxDryLastN = 1 << 16;

struct SamplerConfig {
  float temperature = 0.8f;     // <= 0: greedy
  int top_k = 40;               // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float typical_p = 1.0f;       // >= 1: off (locally typical sampling)
  float repeat_penalty = 1.0f;  // 1: off
  // OpenAI's: logit -= frequency_penalty * count + presence_penalty * (count > 0), over the last
  // repeat_last_n tokens. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int repeat_last_n = 64;  // 0: no penalties; -1: the whole history
  // XTC: with probability xtc_probability, the tokens of probability >= xtc_threshold are
  // removed but the least likely of them. 0: off; a threshold > 0.5 is off too.
  float xtc_probability = 0.0f;
  float xtc_threshold = 0.1f;
  // Mirostat (0: off, 1, 2): target surprise tau, learning rate eta. Replaces the chain with
  // temperature → mirostat, as llama.cpp.
  int mirostat = 0;
  float mirostat_tau = 5.0f;
  float mirostat_eta = 0.1f;
  // DRY: a token that would extend a sequence repeated from the last dry_penalty_last_n tokens
  // (-1: all) by n >= dry_allowed_length tokens loses dry_multiplier * dry_base^(n -
  // dry_allowed_length). Sequence breakers (texts) end what counts as a repeat. 0: off.
  float dry_multiplier = 0.0f;
  float dry_base = 1.75f;
  int dry_allowed_length = 2;
  int dry_penalty_last_n = -1;
  std::vector<std::string> dry_sequence_breakers = {"\n", ":", "\"", "*"};
  // The chain's order; empty: DefaultSamplerStages().
  std::vector<SamplerStage> samplers;
  uint64_t seed = 0;
};

// DRY's breakers as token sequences: a token whose text holds a breaker maps to an empty tail;
// a token whose text ends with a breaker's head maps to the tokens of the rest of it.
using DryBreakers = std::unordered_multimap<int32_t, std::vector<int32_t>>;
DryBreakers MakeDryBreakers(const std::vector<std::string>& breakers, const Tokenizer& tokenizer);

// One token of a sampling distribution.
struct TokenProb {
  int32_t id;
  float p;
};

// What Sample and SampleWithDraft return when no token may be sampled: every logit is -inf
// (or NaN), e.g. a logit bias of false on every token, or on every token a grammar allows.
inline constexpr int32_t kNoToken = -1;

class Sampler {
 public:
  // `tokenizer`: for DRY's sequence breakers (none without it).
  explicit Sampler(const SamplerConfig& config, const Tokenizer* tokenizer = nullptr);
  // DRY's breakers given as token sequences instead (tests).
  void SetDryBreakers(DryBreakers breakers) { dry_breakers_ = std::move(breakers); }
  // Picks a token from logits [n_vocab]; `history` is the context so far (for the penalty).
  // Never a token whose logit is -inf or NaN; kNoToken when every one is.
  int32_t Sample(const float* logits, int n_vocab, const std::vector<int32_t>& history);

  // The distribution Sample draws from, after the whole chain: the candidates that survive,
  // probabilities summing to 1, most likely first (greedy: the arg max alone, p = 1). Tokens of
  // logit -inf or NaN are never candidates; empty when no token is.
  const std::vector<TokenProb>& Distribution(const float* logits, int n_vocab,
                                             const std::vector<int32_t>& history);

  // Speculative step for a drafted token. q: the drafter's distribution for this position
  // (nullptr: a deterministic draft, q one-hot on `draft`: the token is drawn as Sample draws
  // it, so a seed gives the same tokens with and without drafts). Returns the emitted token and
  // sets *accepted when it is the draft. Greedy: the arg max, accepted when it equals the draft.
  // kNoToken (not accepted) when no token may be sampled.
  int32_t SampleWithDraft(const float* logits, int n_vocab, const std::vector<int32_t>& history,
                          int32_t draft, const std::vector<TokenProb>* q, bool* accepted);

  // The distribution the last Sample / SampleWithDraft / Distribution call drew from (after the
  // whole chain; greedy: the arg max alone).
  const std::vector<TokenProb>& last_distribution() const { return dist_; }

  // Mirostat's current target surprise (2 tau at first).
  float mirostat_mu() const { return mu_; }

 private:
  struct Candidate {
    int32_t id;
    float logit;
    float p;
  };
  static bool ByLogit(const Candidate& a, const Candidate& b);
  void Prepare();
  void EnsureSorted();
  void Softmax(float temp);
  void ApplyPenalties(const std::vector<int32_t>& history, int n_vocab);
  void ApplyDry(const std::vector<int32_t>& history, int n_vocab);
  void TopK();
  void TypicalP();
  void TopP();
  void MinP();
  void Xtc();
  void Mirostat(int n_vocab);
  void UpdateMu(int32_t id);
  // One draw from `dist` (the last Distribution; candidates_ still hold its logits), as
  // llama.cpp's dist sampler draws; mirostat's mu updated.
  int32_t Draw(const std::vector<TokenProb>& dist);

  SamplerConfig config_;
  // llama.cpp's generators: 32-bit Mersenne twisters seeded with the seed's low 32 bits, one for
  // the token draws and one for XTC's, so that a seed draws the tokens it draws in llama.cpp.
  std::mt19937 rng_;
  std::mt19937 xtc_rng_;
  float final_temp_ = 1.0f;  // the temperature of the last Distribution's final softmax
  float mu_ = 0.0f;
  DryBreakers dry_breakers_;
  bool prepared_ = false;  // banned tokens removed (candidates_ no longer indexed by id)
  bool sorted_ = false;
  std::vector<Candidate> candidates_;
  std::vector<int> dry_repeat_;
  std::unordered_map<int32_t, int> counts_;
  std::vector<TokenProb> dist_;      // [candidates] Distribution's result
  std::vector<TokenProb> residual_;  // [candidates] SampleWithDraft's max(0, p - q)
};

// Index of the largest value (ties: the lowest index).
int32_t ArgMax(const float* logits, int n);

// The speculative accept rule on explicit uniforms u_accept, u_draw in [0, 1): accept `draft`
// when u_accept < min(1, p(draft) / q(draft)), else draw by inverse CDF from the normalised
// residual max(0, p − q). p, q: distributions (q nullptr: one-hot on draft).
int32_t AcceptOrResample(const std::vector<TokenProb>& p, int32_t draft,
                         const std::vector<TokenProb>* q, double u_accept, double u_draw,
                         bool* accepted, std::vector<TokenProb>* scratch);

}  // namespace lamina
