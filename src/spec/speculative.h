// Speculative decoding's rules: a drafter proposes tokens, the target verifies `[last, d1..dk]` as
// one batch with all logits through the same Session::Decode a prompt chunk takes (so every
// window cell goes through KvCache::Write), accepts the longest prefix its sampler agrees with
// plus its own next token (AcceptWindow), and truncates the rest; the engine (src/engine/) runs
// the windows. At temperature 0 the emitted ids are those of plain
// greedy decoding; above it the accept rule (Sampler::SampleWithDraft) keeps the target's
// distribution. A controller drafts only where a cost model of this machine (window and drafter
// costs measured from the steps run) expects more tokens per second than a plain step.
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/generate.h"
#include "spec/drafter.h"

namespace lamina::spec {

class CostModel;

struct SpecOptions {
  int draft_max = 8;     // tokens drafted per verify step (>= 1)
  int draft_min = 0;     // drafts shorter than this are not verified (a plain step instead)
  bool adaptive = true;  // draft only where the cost model expects it to pay
  // The step costs measured so far, shared by every generation given these options (an engine
  // without one keeps its own), so a request starts from what earlier ones measured.
  std::shared_ptr<CostModel> costs;
};

struct SpecStats {
  int64_t drafted = 0;            // tokens proposed and verified
  int64_t accepted = 0;           // of which the target accepted
  int64_t verify_steps = 0;       // forward passes over a window with at least one draft
  int64_t plain_steps = 0;        // forward passes over one token
  int64_t emitted = 0;            // tokens emitted by decode steps (verify and plain)
  double draft_seconds = 0.0;     // the drafter's calls (catch-ups included)
  double catch_up_seconds = 0.0;  // of which catching up with positions evaluated since
  double window_seconds = 0.0;    // forward passes of the verify steps (timed alone)
  double plain_seconds = 0.0;     // forward passes of the plain steps (timed alone)
  int64_t asks = 0;            // steps that called the drafter (a probe, a draft, or none offered)
  int64_t probes = 0;          // of which probes (one token, while drafting is paused)
  int64_t catch_up_cells = 0;  // positions the drafter caught up with in those calls
  double acceptance() const { return drafted > 0 ? double(accepted) / double(drafted) : 0.0; }
  // Tokens emitted per verify step (accepted drafts + the target's own token).
  double tokens_per_verify() const {
    return verify_steps > 0 ? double(accepted + verify_steps) / double(verify_steps) : 0.0;
  }
  void Add(const SpecStats& o);
};

// What speculation costs on the machine it runs on, measured from the steps the engine runs (no
// table): the forward pass over a window of W tokens, the drafter's time per drafted token and
// per cell it catches up after a pause (an MTP head, a draft model), all in plain-step units,
// and the drafter's long-run acceptance (the prior of a new request). Each time is an
// exponential average of log seconds (weight 1/4; the first three samples: their minimum) in
// which a sample counts for at most a factor of e^0.5 either way, so it tracks about the median
// time: a preempted sample (10x on a shared machine) barely moves it, a load or kernel change
// shows within ~10 samples. A window length not measured yet is interpolated between measured
// ones, or extrapolated along the average slope up to the longest one measured (a quarter step
// per token before any window is measured: optimistic, so that lengths get tried); a window
// costs at least the shorter ones and at most its length in plain steps (batching never costs
// more than stepping), and a length's first sample counts for no more than its prediction.
class CostModel {
 public:
  static constexpr int kMaxWindow = 64;  // longer windows are costed as this one
  static constexpr int kBulkCells = 8;   // a longer catch-up is priced as a bulk one
  void ObserveWindow(int n_tokens, double seconds);
  void ObserveDraft(int passes, double seconds);
  void ObserveCatchUp(int cells, double seconds);
  void ObserveAcceptance(int drafted, int accepted);
  // Whether a plain step (a one-token window) was timed: the unit of every cost.
  bool has_step() const { return n_[1] > 0; }
  bool measured(int n_tokens) const;
  // In plain steps: a window of n_tokens (1 for one token), `passes` drafter passes, `cells`
  // cells of catch-up (0 while not measured: the first use measures them). Catch-ups of more
  // than kBulkCells cells (after a pause) are priced apart from the short ones (the accepted
  // drafts' cells, where a pass's fixed cost is most of it): before one is measured, at a
  // quarter of a short one's price per cell (optimistic, so that a resumption gets tried).
  double WindowSteps(int n_tokens) const;
  double DraftSteps(double passes) const;
  double CatchUpSteps(double cells) const;
  // The per-position acceptance the drafter has shown across requests (0.5 before any).
  double acceptance() const;
  // What asking the drafter gave across requests: a step that asked took `steps` plain steps
  // (its window and the drafter's call, measured) and emitted `tokens`. Decayed by 0.95 per
  // step, so it holds the last ~20.
  void ObserveRealized(int tokens, double steps);
  // The decayed sums (0 before any): tokens emitted and plain steps taken by steps that asked.
  double realized_tokens() const { return real_tokens_; }
  double realized_steps() const { return real_steps_; }
  // A plain step's time (the unit), in seconds; 0 before one is measured.
  double step_seconds() const { return has_step() ? std::exp(log_[1]) : 0.0; }
  // The probe schedule of a paused drafter whose asking costs a pass (an MTP head, a draft
  // model), kept across requests: the wait between probes that the last request's controller
  // reached and the plain steps left before its next probe (0, 0: none kept, or drafting paid).
  // A new request continues it, so a head that loses is probed about once per MaxProbeGap plain
  // steps of the whole stream of requests, not 3-4 times in each short one.
  void SetProbeSchedule(int gap, int wait) {
    probe_gap_ = gap;
    probe_wait_ = wait;
  }
  int probe_gap() const { return probe_gap_; }
  int probe_wait() const { return probe_wait_; }

 private:
  static constexpr int kDraft = kMaxWindow + 1;
  static constexpr int kCatchUp = kMaxWindow + 2;
  static constexpr int kBulkCatchUp = kMaxWindow + 3;
  void Observe(int entry, double log_seconds);
  double Ratio(int entry) const;                 // entry's time over a plain step's
  std::array<double, kMaxWindow + 4> log_{};     // [entry] log seconds: windows by length, then
                                                 // per draft pass, per caught-up cell (short
                                                 // catch-ups, bulk ones)
  std::array<int, kMaxWindow + 4> n_{};          // [entry] observations
  double acc_hits_ = 0.0, acc_misses_ = 0.0;     // decayed per-position outcomes
  double real_tokens_ = 0.0, real_steps_ = 0.0;  // decayed outcomes of the steps that asked
  int probe_gap_ = 0, probe_wait_ = 0;           // the kept probe schedule (SetProbeSchedule)
};

// One finished decode step of a sequence, as the controller sees it.
struct StepRecord {
  bool asked = false;  // the drafter was asked (a step that asked and got no draft pays for it)
  int drafted = 0;     // tokens verified
  int accepted = 0;    // of which accepted
  int emitted = 1;     // tokens emitted by the step
  double window_seconds = 0.0;  // the forward pass; <= 0: not timed (a batch shared with others)
  double draft_seconds = 0.0;   // the drafter's call, catch-up included
  int catch_up_cells = 0;       // positions the drafter caught up with in that call
  double catch_up_seconds = 0.0;
  int catch_up_skipped = 0;  // positions a probe left to catch up (Drafter::Probe)
};

// Decides per step how many tokens to draft, 0 for a plain step. With acceptance a per
// position (geometric: this request's outcomes, decayed per window and by 0.9 per 32 plain
// steps between asks, with the cost model's
// long-run figure as a prior worth two positions), a draft of k gives E = 1 + a + ... + a^k
// tokens per step; asking costs DraftSteps(k) + CatchUpSteps(E - 1) (an MTP head re-evaluates
// the accepted tokens' cells; a draft model keeps them: measured per drafter) and the window
// WindowSteps(k + 1), all weighted by how often the drafter proposes anything. The k with the
// most tokens per unit of time is drafted when it beats a plain step by 3 %. k is at most 2 at
// first, then twice a draft accepted whole or one more than the accepted part of one that was
// not (long windows are earned, so a wrong prior stays cheap), or longer where its window and
// draft cost at most a quarter step more (a bandwidth-bound model: up to the maximum). After 32
// windows in a row one plain step times the unit again. A drafter that must catch up first (a
// paused MTP head: one batched pass) is asked again only when the gain expected over the next
// tokens (as many as the request has emitted so far, at least 32) covers that catch-up. While
// drafting does not pay, a one-token probe runs after 8 plain steps, the wait doubling after each
// probe not accepted whole, back to 8 once drafting pays; the wait grows to at least 32 steps and
// up to the one at which a probe's expected cost (the drafter's pass and the window's extra token)
// is 0.8 % of the plain steps between probes (at most 256), and no probe runs while the probes'
// loss (steps beyond the tokens they gave) would pass 1 % of the tokens emitted plus two probes'
// cost. A drafter that probes without catching
// up (Drafter::Probe: an MTP head) pays only that; any other whose catch-up costs more than 0.02
// steps per missed position is probed only if drafting at its long-run acceptance would repay it.
// What the steps that asked took is measured too (their windows and the drafter's calls, in
// plain steps, against the tokens they emitted; decayed per step and per 32 idle steps, with
// the cost model's long-run figure as a prior worth two steps): for a drafter whose asking costs
// a pass (an MTP head, a draft model; not prompt lookup), once the request has two steps of its
// own evidence the plan's rate is at most that measured one, so a drafter whose windows and passes
// took a plain step or more per token stops whatever the model predicts, and a resumption must
// repay its catch-up at the measured rate. While it is measured to lose, a probe accepted whole
// doubles the wait too, and the probes' loss allowance is one probe's cost instead of two.
class DraftController {
 public:
  // costs: shared, outlives the controller; adaptive false: always draft max_tokens. A drafter
  // whose asking costs a pass starts from the probe schedule earlier requests left paused
  // (CostModel::probe_gap): its first probe comes when that wait is over, not 8 steps in.
  DraftController(CostModel* costs, bool adaptive);
  // The tokens to draft this step (at most max_tokens), 0 for a plain step.
  int Plan(int max_tokens);
  void Record(const StepRecord& r);
  // The acceptance per position this request's plan uses.
  double acceptance() const;
  // Whether the step Plan just planned is a probe (the engine asks Drafter::Probe).
  bool probing() const { return probing_; }
  // The drafter probes without catching up (Drafter::probes_without_catch_up).
  void set_probes_without_catch_up(bool v) { probes_without_catch_up_ = v; }
  // The longest wait between probes, in plain steps.
  int MaxProbeGap() const;
  // What a probe is expected to cost, in plain steps.
  double ProbeSteps() const;

 private:
  static constexpr int kMinGap = 8, kMaxGap = 32, kLongestGap = 256;
  static constexpr int kControlGap = 32;  // windows in a row before a plain step is timed
  // Expected tokens per plain-step time drafting k at acceptance a.
  double Rate(int k, double a) const;
  // The best Rate over k = 1..max_tokens (1.0 and *k = 0 when none beats a plain step).
  double BestRate(int max_tokens, double a, int* k) const;
  // The longest draft to consider: the earned length cap_, or longer where that costs little.
  int Limit(int max_tokens) const;
  // Whether drafting at `rate` repays the catch-up the drafter needs first.
  bool Repays(double rate) const;
  // The tokens per plain step that asking the drafter has given, measured (this request's steps
  // that asked, with the cost model's long-run figure as a prior worth kRealPrior steps), and
  // in *weight the plain steps of evidence behind it.
  double Realized(double* weight) const;
  // Keeps the probe schedule in the cost model for the next request (a drafter that costs a
  // pass; none while drafting pays).
  void KeepSchedule();

  CostModel* costs_;
  bool adaptive_;
  double hits_ = 0.0, misses_ = 0.0;  // this request's decayed per-position outcomes
  double asks_ = 0.0, offers_ = 0.0;  // decayed: steps that asked, and that got a draft
  // Decayed, over steps that asked right after asking: cells caught up, and the tokens the
  // previous step accepted (an MTP head re-evaluates those; a draft model keeps them).
  double cu_cells_ = 0.0, cu_accepted_ = 0.0;
  // Decayed, over the steps that asked: the tokens they emitted and the plain steps they took.
  double real_tokens_ = 0.0, real_steps_ = 0.0;
  int since_ask_ = 0;        // positions the drafter is behind: steps since it last caught up
  int64_t emitted_ = 0;      // tokens this request's decode steps emitted
  int idle_ = 0;             // plain steps since the drafter was last asked
  double probe_loss_ = 0.0;  // steps this request's probes took beyond the tokens they gave
  int since_plain_ = 0;      // windows since the last plain step
  int prev_emitted_ = 1;
  bool ever_asked_ = false;
  bool probing_ = false;  // this step's draft is a probe
  bool probes_without_catch_up_ = false;
  int gap_ = kMinGap;  // plain steps between probes
  int until_probe_ = 0;
  int cap_ = 2;  // the longest draft the evidence allows so far
};

// The most draft tokens worth verifying on sequence `seq` of `session` this step: draft_max,
// capped by what could ever be kept: the room left in the sequence's context after the token
// the window starts with, the generation's remaining tokens after it (remaining < 0: no limit)
// and, for a hybrid model, the ring of recurrent states a rejected draft is rolled back within
// (further back Truncate could not restore the state exactly). <= 0: do not draft. The
// engine caps every window with it.
int DraftBudget(const Session& session, int seq, int draft_max, int remaining);

// One verify window's outcome: window[0..used] keep their cells (the tokens whose logits were
// used; the rest are rejected drafts), `accepted` drafts were kept, `emitted` tokens sampled,
// and `last` is the final step (done when generation ended).
struct WindowOutcome {
  int used = 0;
  int accepted = 0;
  int emitted = 0;
  Generator::Step last;
};

// The one accept rule of every verify window (the engine's, for the CLI and the server alike): row
// i of `rows` ([draft.size() + 1, n_vocab]) predicts the token after window[i]; drafts are accepted
// while the generator's sampler agrees (Generator::NextWithDraft), and the first rejection — or the
// row after the last draft — gives the target's own token and ends the window. on_step(i, step,
// logits) sees every step (its text and token) and returns false to stop after it (a cancelled
// request).
WindowOutcome AcceptWindow(Generator& gen, const float* rows, int n_vocab,
                           const std::vector<int32_t>& draft,
                           const std::function<bool(int, Generator::Step&, const float*)>& on_step);

}  // namespace lamina::spec
