// The speculative generation loop and its draft controller (see speculative.h).
#include "spec/speculative.h"

#include <algorithm>
#include <cmath>

#include "util/timer.h"

namespace lamina::spec {

void SpecStats::Add(const SpecStats& o) {
  drafted += o.drafted;
  accepted += o.accepted;
  verify_steps += o.verify_steps;
  plain_steps += o.plain_steps;
  emitted += o.emitted;
  draft_seconds += o.draft_seconds;
  catch_up_seconds += o.catch_up_seconds;
  window_seconds += o.window_seconds;
  plain_seconds += o.plain_seconds;
  asks += o.asks;
  probes += o.probes;
  catch_up_cells += o.catch_up_cells;
}

namespace {
constexpr double kAlpha = 0.25;         // the averages' weight of a new observation
constexpr int kWarm = 3;                // samples of a time taken as their minimum
constexpr double kClamp = 0.5;          // the most log residual one sample counts for
constexpr double kPriorSlope = 0.25;    // steps per window token before any window is measured
constexpr double kMargin = 0.03;        // the gain a draft must promise over a plain step
constexpr double kDecay = 0.9;          // a request's outcomes kept per window
constexpr double kPrior = 2.0;          // positions the long-run acceptance is worth
constexpr double kProbeCatchUp = 0.02;  // steps per missed cell a probe may pay to catch up
constexpr int kHorizon = 32;          // the fewest tokens a resumed drafter is expected to run for
constexpr double kFreeSteps = 0.25;   // extra steps a draft beyond the earned length may cost
constexpr double kBulkPrior = 0.25;   // a bulk catch-up cell against a short one, unmeasured
constexpr double kProbeShare = 0.01;  // the probes' loss over the tokens emitted, at most
constexpr double kGapShare = 0.008;   // a probe's cost over the plain steps before it, at most
constexpr double kRealPrior = 2.0;    // plain steps of evidence the long-run realized rate is worth
constexpr double kRealMin = 2.0;      // plain steps of evidence before the realized rate vetoes
constexpr double kRealClamp = 2.0;    // a step's measured cost counts within [1/c, c]x predicted
constexpr double kPassCost = 0.01;    // steps per pass above which asking the drafter costs a pass
}  // namespace

void CostModel::Observe(int entry, double log_seconds) {
  // The first samples: their minimum (one preempted sample must not set the level).
  if (n_[entry]++ < kWarm) {
    log_[entry] = n_[entry] == 1 ? log_seconds : std::min(log_[entry], log_seconds);
    return;
  }
  // Each sample counts for at most a factor of e^kClamp either way: the average tracks about
  // the median time, which a preempted sample (10x on a shared machine) barely moves.
  log_[entry] += kAlpha * std::clamp(log_seconds - log_[entry], -kClamp, kClamp);
}

void CostModel::ObserveWindow(int n_tokens, double seconds) {
  if (n_tokens < 1 || !(seconds > 0.0)) return;
  const int w = std::min(n_tokens, kMaxWindow);
  double ls = std::log(seconds);
  // A length's first sample may be a preempted one: it starts no higher than predicted.
  if (n_[w] == 0 && w > 1 && has_step()) ls = std::min(ls, log_[1] + std::log(WindowSteps(w)));
  Observe(w, ls);
}

void CostModel::ObserveDraft(int passes, double seconds) {
  if (passes < 1 || !(seconds >= 0.0)) return;
  Observe(kDraft, std::log(std::max(seconds, 1e-9) / passes));
}

void CostModel::ObserveCatchUp(int cells, double seconds) {
  if (cells < 1 || !(seconds >= 0.0)) return;
  Observe(cells > kBulkCells ? kBulkCatchUp : kCatchUp, std::log(std::max(seconds, 1e-9) / cells));
}

void CostModel::ObserveAcceptance(int drafted, int accepted) {
  if (drafted <= 0) return;
  acc_hits_ = 0.95 * acc_hits_ + accepted;
  acc_misses_ = 0.95 * acc_misses_ + (accepted < drafted ? 1.0 : 0.0);
}

void CostModel::ObserveRealized(int tokens, double steps) {
  if (tokens < 1 || !(steps > 0.0)) return;
  real_tokens_ = 0.95 * real_tokens_ + tokens;
  real_steps_ = 0.95 * real_steps_ + steps;
}

double CostModel::acceptance() const { return (acc_hits_ + 1.0) / (acc_hits_ + acc_misses_ + 2.0); }

bool CostModel::measured(int n_tokens) const {
  return n_tokens >= 1 && n_[std::min(n_tokens, kMaxWindow)] > 0;
}

double CostModel::Ratio(int entry) const { return std::exp(log_[entry] - log_[1]); }

double CostModel::WindowSteps(int n_tokens) const {
  if (n_tokens <= 1 || !has_step()) return 1.0;
  const int w = std::min(n_tokens, kMaxWindow);
  // The nearest measured lengths below and at or above w, and the dearest one below.
  int lo = 1, hi = 0;
  double floor = 1.0;
  for (int j = 2; j < w; ++j) {
    if (n_[j] == 0) continue;
    lo = j;
    floor = std::max(floor, Ratio(j));
  }
  for (int j = w; j <= kMaxWindow && hi == 0; ++j) {
    if (n_[j] > 0) hi = j;
  }
  const double c_lo = lo == 1 ? 1.0 : Ratio(lo);
  double c;
  if (hi == w) {
    c = Ratio(w);
  } else if (hi > 0) {
    c = c_lo + (Ratio(hi) - c_lo) * (w - lo) / (hi - lo);
  } else {
    const double slope = lo == 1 ? kPriorSlope : std::max(0.0, (c_lo - 1.0) / (lo - 1));
    c = c_lo + slope * (w - lo);
  }
  // Never below a shorter window, nor above w separate steps (batching never costs more).
  return std::clamp(std::max(c, floor), 1.0, static_cast<double>(w));
}

double CostModel::DraftSteps(double passes) const {
  return n_[kDraft] > 0 && has_step() ? passes * Ratio(kDraft) : 0.0;
}

double CostModel::CatchUpSteps(double cells) const {
  if (!has_step()) return 0.0;
  if (cells > kBulkCells && n_[kBulkCatchUp] > 0) return cells * Ratio(kBulkCatchUp);
  if (n_[kCatchUp] == 0) return 0.0;
  return cells * Ratio(kCatchUp) * (cells > kBulkCells ? kBulkPrior : 1.0);
}

DraftController::DraftController(CostModel* costs, bool adaptive)
    : costs_(costs), adaptive_(adaptive) {
  // The schedule a paused drafter left: the stream of requests is probed as one (a request
  // does not restart the back-off at 8 steps, nor get probes of its own for free).
  if (adaptive_ && costs_->DraftSteps(1) > kPassCost && costs_->probe_gap() > kMinGap) {
    gap_ = std::min(costs_->probe_gap(), kLongestGap);
    until_probe_ = std::clamp(costs_->probe_wait(), 0, gap_);
  }
}

void DraftController::KeepSchedule() {
  if (!adaptive_ || costs_->DraftSteps(1) <= kPassCost) return;
  if (gap_ > kMinGap) {
    costs_->SetProbeSchedule(gap_, until_probe_);
  } else {
    costs_->SetProbeSchedule(0, 0);
  }
}

double DraftController::acceptance() const {
  const double a0 = costs_->acceptance();
  const double hits = hits_ + kPrior * a0, misses = misses_ + kPrior * (1.0 - a0);
  return std::min(0.99, hits / (hits + misses));
}

double DraftController::Rate(int k, double a) const {
  double e = 1.0, p = 1.0;  // E[tokens] of a draft of k: 1 + a + ... + a^k
  for (int i = 0; i < k; ++i) e += (p *= a);
  const double q = (offers_ + 1.0) / (asks_ + 1.0);  // how often asking gives a draft
  const double cu_per_accepted = (cu_cells_ + 1.0) / (cu_accepted_ + 1.0);
  const double offered = costs_->WindowSteps(k + 1) + costs_->DraftSteps(k) +
                         costs_->CatchUpSteps(cu_per_accepted * (e - 1.0));
  const double refused = 1.0 + costs_->DraftSteps(1);
  return (q * e + (1.0 - q)) / (q * offered + (1.0 - q) * refused);
}

double DraftController::BestRate(int max_tokens, double a, int* k) const {
  *k = 0;
  double best = 1.0;
  for (int i = 1; i <= std::min(max_tokens, CostModel::kMaxWindow - 1); ++i) {
    const double r = Rate(i, a);
    if (r > best) {
      best = r;
      *k = i;
    }
  }
  return best;
}

int DraftController::Limit(int max_tokens) const {
  // The earned length, and any longer one that costs at most kFreeSteps more (on a
  // bandwidth-bound model, every length up to the maximum).
  int limit = std::min(max_tokens, cap_);
  const double base = costs_->WindowSteps(limit + 1) + costs_->DraftSteps(limit);
  while (limit < max_tokens && limit + 1 < CostModel::kMaxWindow &&
         costs_->WindowSteps(limit + 2) + costs_->DraftSteps(limit + 1) <= base + kFreeSteps) {
    ++limit;
  }
  return limit;
}

bool DraftController::Repays(double rate) const {
  // A drafter that must catch up first (one batched pass over the positions it missed) is
  // asked only when the time expected to be saved over the next tokens covers it: a request is
  // expected to go on for about as long as it has run (at least kHorizon tokens).
  // (A request's first ask after a few plain steps is not held back; one after a kept probe
  // wait catches up as a resumption does.)
  const double horizon = std::max<double>(kHorizon, static_cast<double>(emitted_));
  return since_ask_ == 0 || (!ever_asked_ && since_ask_ <= CostModel::kBulkCells) ||
         horizon * (1.0 - 1.0 / rate) >= costs_->CatchUpSteps(since_ask_);
}

double DraftController::Realized(double* weight) const {
  double tokens = real_tokens_, steps = real_steps_;
  if (costs_->realized_steps() > 0.0) {  // the long-run figure, worth at most kRealPrior steps
    const double w = std::min(kRealPrior, costs_->realized_steps());
    tokens += w * costs_->realized_tokens() / costs_->realized_steps();
    steps += w;
  }
  *weight = steps;
  return steps > 0.0 ? tokens / steps : 0.0;
}

double DraftController::ProbeSteps() const {
  // A probe costs the drafter's pass and, when it drafts, a window token (its catch-up, where
  // it has one, is paid by any later draft as well).
  return costs_->DraftSteps(1) + (costs_->WindowSteps(2) - 1.0);
}

int DraftController::MaxProbeGap() const {
  // At the longest wait, a probe costs kGapShare of the plain steps it follows (under the 1 %
  // of the loss allowance, so that a head whose proposals are all rejected stays below it).
  return std::clamp(static_cast<int>(std::ceil(ProbeSteps() / kGapShare)), kMaxGap, kLongestGap);
}

int DraftController::Plan(int max_tokens) {
  probing_ = false;
  if (max_tokens <= 0) return 0;
  if (!adaptive_) return max_tokens;
  // A plain step first (the unit of every cost), and one after a long run of windows, so that
  // the unit follows the machine's load as the windows' times do.
  if (!costs_->has_step() || since_plain_ >= kControlGap) return 0;
  int k = 0;
  const double best = BestRate(Limit(max_tokens), acceptance(), &k);
  const double q = (offers_ + 1.0) / (asks_ + 1.0);
  // What asking has given, measured: the cost model's prediction must not be above it (a
  // drafter whose windows and passes took a plain step or more per token they gave stops,
  // whatever the model predicts; a resumption must be repaid at the measured rate).
  double weight = 0.0;
  const double realized = Realized(&weight);
  // This holds for a drafter whose asking is free (prompt lookup) too: its windows are priced
  // as measured, but the model's mix of lengths and acceptances can still promise a gain the
  // windows do not give (counting: one-token matches, mostly rejected, each window 1.4 steps).
  const bool proven = real_steps_ >= kRealMin;
  const double rate = proven ? std::min(best, realized) : best;
  // A resumption (a bulk catch-up over the pause first) is priced at the measured rate, the
  // long-run figure included, even before this request has two steps of its own: a trial that
  // catches up a whole pause is not made against the measurement that asking loses.
  const bool resumes = since_ask_ > CostModel::kBulkCells;
  const double resume_rate =
      weight >= kRealMin && costs_->DraftSteps(1) > kPassCost ? std::min(rate, realized) : rate;
  if (k > 0 && rate >= 1.0 + kMargin * q && Repays(resumes ? resume_rate : rate)) {
    // Drafting the evidence supports restarts the probes' back-off at 8; a trial against the
    // long-run measurement that asking loses (a request without two steps of its own yet: the
    // veto stops it after them) keeps the back-off, so that it does not undo a kept schedule.
    const bool long_run_loses =
        costs_->DraftSteps(1) > kPassCost && costs_->realized_tokens() < costs_->realized_steps();
    if (proven || !long_run_loses) {
      gap_ = kMinGap;
      until_probe_ = gap_;
    }
    return k;
  }
  if (until_probe_ > 0) return 0;
  // A probe of one token (the costs may have changed too), unless the drafter must first catch
  // up at a price that drafting at its long-run acceptance would not repay (a losing MTP head).
  if (!probes_without_catch_up_ && costs_->CatchUpSteps(since_ask_) > kProbeCatchUp * since_ask_) {
    int k_opt = 0;
    const double opt = BestRate(max_tokens, std::max(acceptance(), costs_->acceptance()), &k_opt);
    if (k_opt == 0 || !Repays(opt)) {
      until_probe_ = gap_;
      return 0;
    }
  }
  // Probes lose at most kProbeShare of the steps run (past two probes' worth; one where asking
  // the drafter has been measured to lose): what they cost beyond the tokens they gave is
  // counted (Record).
  const double free_probes = proven && realized < 1.0 ? 1.0 : 2.0;
  if (probe_loss_ + ProbeSteps() >
      kProbeShare * static_cast<double>(emitted_) + free_probes * ProbeSteps()) {
    return 0;
  }
  probing_ = true;
  return 1;
}

void DraftController::Record(const StepRecord& r) {
  if (r.window_seconds > 0.0) costs_->ObserveWindow(r.drafted + 1, r.window_seconds);
  emitted_ += r.emitted;
  since_plain_ = r.drafted > 0 ? since_plain_ + 1 : 0;
  if (r.drafted == 0 && until_probe_ > 0) --until_probe_;
  if (!r.asked) {
    ++since_ask_;
    ++idle_;
    prev_emitted_ = r.emitted;
    KeepSchedule();
    return;
  }
  // Evidence ages with the plain steps since the drafter was last asked too (a probe after a
  // long pause tells more about the text now than the windows before it).
  if (idle_ > 0) {
    const double age = std::pow(kDecay, static_cast<double>(idle_) / kControlGap);
    hits_ *= age;
    misses_ *= age;
    asks_ *= age;
    offers_ *= age;
    real_tokens_ *= age;
    real_steps_ *= age;
    idle_ = 0;
  }
  if (r.draft_seconds > 0.0) {
    costs_->ObserveDraft(std::max(1, r.drafted), r.draft_seconds - r.catch_up_seconds);
    costs_->ObserveCatchUp(r.catch_up_cells, r.catch_up_seconds);
  }
  // What this step took, measured in plain steps (its window and the drafter's call), against
  // the tokens it gave; one sample counts within kRealClamp of the cost model's prediction (a
  // preempted step barely moves it). A resumption's bulk catch-up is left out: it is paid once
  // for the windows after it, and Repays prices it.
  if (r.drafted > 0 && r.window_seconds > 0.0 && costs_->has_step()) {
    const bool bulk = r.catch_up_cells > CostModel::kBulkCells;
    const double predicted = costs_->WindowSteps(r.drafted + 1) +
                             costs_->DraftSteps(std::max(1, r.drafted)) +
                             (bulk ? 0.0 : costs_->CatchUpSteps(r.catch_up_cells));
    const double measured =
        (r.window_seconds + r.draft_seconds - (bulk ? r.catch_up_seconds : 0.0)) /
        costs_->step_seconds();
    const double steps = std::clamp(measured, predicted / kRealClamp, predicted * kRealClamp);
    real_tokens_ = kDecay * real_tokens_ + r.emitted;
    real_steps_ = kDecay * real_steps_ + steps;
    costs_->ObserveRealized(r.emitted, steps);
  }
  if (ever_asked_ && since_ask_ == 0) {  // the catch-up of a drafter asked step after step
    cu_cells_ = kDecay * cu_cells_ + r.catch_up_cells;
    cu_accepted_ = kDecay * cu_accepted_ + std::max(0, prev_emitted_ - 1);
  }
  asks_ = kDecay * asks_ + 1.0;
  offers_ = kDecay * offers_ + (r.drafted > 0 ? 1.0 : 0.0);
  if (r.drafted > 0) {
    // Longer drafts only after the evidence: twice a fully accepted one, else one more than
    // was accepted.
    cap_ = r.accepted == r.drafted ? std::max(cap_, 2 * r.drafted) : r.accepted + 1;
    hits_ = kDecay * hits_ + r.accepted;
    misses_ = kDecay * misses_ + (r.accepted < r.drafted ? 1.0 : 0.0);
    costs_->ObserveAcceptance(r.drafted, r.accepted);
  }
  // The next probe waits twice as long (unless drafting resumes: Plan; or the probe's draft
  // was accepted whole by a drafter not measured to lose: the same wait), but a probe that got
  // no draft from a drafter whose asking is free (lookup: no match) tries again next step.
  if (probing_ && costs_->has_step()) {  // the steps it took beyond the tokens it gave
    const double steps = costs_->WindowSteps(r.drafted + 1) + costs_->DraftSteps(1) +
                         costs_->CatchUpSteps(r.catch_up_cells);
    probe_loss_ += std::max(0.0, steps - r.emitted);
  }
  if (probing_ && (r.drafted > 0 || costs_->DraftSteps(1) > kPassCost)) {
    double weight = 0.0;
    const bool loses = Realized(&weight) < 1.0 && real_steps_ >= kRealMin;
    if (r.drafted == 0 || r.accepted < r.drafted || loses) {
      gap_ = std::min(MaxProbeGap(), 2 * gap_);
    }
    until_probe_ = gap_;
  }
  probing_ = false;
  ever_asked_ = true;
  // A probe that skipped the catch-up leaves the drafter behind by what it missed and this step.
  since_ask_ = r.catch_up_skipped > 0 ? r.catch_up_skipped + r.emitted : 0;
  prev_emitted_ = r.emitted;
  KeepSchedule();
}

int DraftBudget(const Session& session, int seq, int draft_max, int remaining) {
  // Drafts beyond the room left or the token budget could never be kept.
  int k_max = std::min(draft_max, session.n_ctx() - session.n_past(seq) - 1);
  if (remaining >= 0) k_max = std::min(k_max, remaining - 1);
  // A hybrid model rolls its recurrent state back exactly only within its ring of states.
  if (!session.recurrent().empty()) k_max = std::min(k_max, session.recurrent().ring() - 1);
  return k_max;
}

WindowOutcome AcceptWindow(
    Generator& gen, const float* rows, int n_vocab, const std::vector<int32_t>& draft,
    const std::function<bool(int, Generator::Step&, const float*)>& on_step) {
  WindowOutcome out;
  const int k = static_cast<int>(draft.size());
  for (int i = 0;; ++i) {
    const float* logits = rows + static_cast<size_t>(i) * n_vocab;
    bool accepted = false;
    out.last = i < k ? gen.NextWithDraft(logits, n_vocab, draft[i], nullptr, &accepted)
                     : gen.Next(logits, n_vocab);
    out.used = i;
    if (out.last.token >= 0) ++out.emitted;
    if (accepted) ++out.accepted;
    const bool go_on = on_step(i, out.last, logits);
    if (out.last.done || !go_on || !accepted) break;
  }
  return out;
}

}  // namespace lamina::spec
