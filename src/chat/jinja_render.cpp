// The Jinja renderer (jinja_internal.h): statements, expressions, operators, loops, macros and
// calls, each step counted against the template's limits; and Template::Render.
#include <algorithm>
#include <cmath>
#include <limits>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace lamina::chat::jinja {
namespace internal {

Renderer::Renderer(const Impl& impl, const Value& context, const RenderOptions& options)
    : impl_(impl), lim_(impl.limits), context_(context), options_(options) {
  frames_.emplace_back();
}

bool Renderer::Run(std::string* out) {
  JINJA_TRY(CheckContext());
  Flow flow = Flow::kNormal;
  JINJA_TRY(RenderBody(impl_.body, &flow));
  *out = std::move(out_);
  return true;
}

// ---- limits

bool Renderer::Fail(size_t pos, const std::string& what) {
  if (err_.message.empty()) err_.message = impl_.positions->Where(pos) + ": " + what;
  return false;
}

bool Renderer::Charge(size_t pos, int64_t units) {
  work_ += units;
  if (work_ > lim_.max_work) {
    return Fail(
        pos, "the template work limit of " + std::to_string(lim_.max_work) + " steps is exceeded");
  }
  return true;
}

bool Renderer::CheckSize(size_t pos, size_t n) {
  if (n > lim_.max_output_bytes) {
    return Fail(pos, "a value of " + std::to_string(n) + " bytes is over the output limit of " +
                         std::to_string(lim_.max_output_bytes) + " bytes");
  }
  return Charge(pos, static_cast<int64_t>(n / 16));
}

bool Renderer::CheckCount(size_t pos, int64_t n) {
  if (n > lim_.max_loop_iterations) {
    return Fail(pos, "a list of " + std::to_string(n) + " items is over the loop limit of " +
                         std::to_string(lim_.max_loop_iterations) + " iterations");
  }
  return Charge(pos, n);
}

bool Renderer::CheckDepth(size_t pos) {
  if (depth_ > lim_.max_nesting * 4) {
    return Fail(pos,
                "rendering nests deeper than the limit of " + std::to_string(lim_.max_nesting * 4));
  }
  return true;
}

bool Renderer::CountIteration(size_t pos) {
  if (++iterations_ > lim_.max_loop_iterations) {
    return Fail(pos, "the loop limit of " + std::to_string(lim_.max_loop_iterations) +
                         " iterations is exceeded");
  }
  return Charge(pos, 1);
}

// The variables a render starts with: nested at most kMaxValueDepth, checked without
// recursion (each visit charged as work, so shared sub-values cannot make it unbounded).
bool Renderer::CheckContext() {
  std::vector<std::pair<const Value*, int>> todo{{&context_, 0}};
  while (!todo.empty()) {
    auto [v, depth] = todo.back();
    todo.pop_back();
    if (!v->is_array() && !v->is_object()) continue;
    if (depth >= kMaxValueDepth) {
      return Fail(0, "the template's variables nest deeper than the limit of " +
                         std::to_string(kMaxValueDepth));
    }
    if (v->is_array()) {
      JINJA_TRY(Charge(0, static_cast<int64_t>(v->array().size())));
      for (const Value& x : v->array()) todo.push_back({&x, depth + 1});
    } else {
      JINJA_TRY(Charge(0, static_cast<int64_t>(v->object().size())));
      for (const auto& [k, x] : v->object()) todo.push_back({&x, depth + 1});
    }
  }
  return true;
}

// A value stored by `set`: bounded nesting, and a namespace never inside itself (so values
// stay acyclic and every walk over them ends).
bool Renderer::CheckStored(size_t pos, const Value& v, const Object* forbid, int depth) {
  if (depth > kMaxValueDepth) {
    return Fail(pos, "values nest deeper than the limit of " + std::to_string(kMaxValueDepth));
  }
  if (v.is_array()) {
    JINJA_TRY(Charge(pos, static_cast<int64_t>(v.array().size())));
    for (const Value& x : v.array()) JINJA_TRY(CheckStored(pos, x, forbid, depth + 1));
  } else if (v.is_object()) {
    if (&v.object() == forbid) return Fail(pos, "a namespace cannot hold itself");
    JINJA_TRY(Charge(pos, static_cast<int64_t>(v.object().size())));
    for (const auto& [k, x] : v.object()) JINJA_TRY(CheckStored(pos, x, forbid, depth + 1));
  }
  return true;
}

// ---- output and variables

bool Renderer::Emit(size_t pos, std::string_view s) {
  if (out_.size() + s.size() > lim_.max_output_bytes) {
    return Fail(
        pos, "the output is over the limit of " + std::to_string(lim_.max_output_bytes) + " bytes");
  }
  out_ += s;
  return Charge(pos, static_cast<int64_t>(s.size() / 16 + 1));
}

bool Renderer::EmitValue(size_t pos, const Value& v) {
  if (v.is_string()) return Emit(pos, v.str());
  std::string text;
  PyStr(v, &text);
  return Emit(pos, text);
}

bool Renderer::Capture(const Body& body, std::string* text) {
  std::string saved = std::move(out_);
  out_.clear();
  Flow flow = Flow::kNormal;
  const bool ok = RenderBody(body, &flow);
  *text = std::move(out_);
  out_ = std::move(saved);
  return ok;
}

const Value* Renderer::Lookup(const std::string& name) const {
  for (size_t i = frames_.size(); i-- > floor_;) {
    for (const auto& [k, v] : frames_[i]) {
      if (k == name) return &v;
    }
  }
  if (floor_ > 0) {
    for (const auto& [k, v] : frames_[0]) {
      if (k == name) return &v;
    }
  }
  return context_.Find(name);
}

void Renderer::Assign(const std::string& name, Value v) {
  Frame& f = frames_.back();
  for (auto& [k, old] : f) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  f.emplace_back(name, std::move(v));
}

// ---- statements

bool Renderer::RenderBody(const Body& body, Flow* flow) {
  DepthGuard g(&depth_);
  for (const auto& s : body) {
    JINJA_TRY(RenderStmt(*s, flow));
    if (*flow != Flow::kNormal) return true;
  }
  return true;
}

bool Renderer::RenderStmt(const Stmt& s, Flow* flow) {
  JINJA_TRY(CheckDepth(s.pos));
  JINJA_TRY(Charge(s.pos, 1));
  switch (s.k) {
    case Stmt::K::kText:
      return Emit(s.pos, s.text);
    case Stmt::K::kOutput: {
      Value v;
      JINJA_TRY(Eval(*s.expr, &v));
      return EmitValue(s.pos, v);
    }
    case Stmt::K::kIf:
      return RenderIf(s, flow);
    case Stmt::K::kFor:
      return RenderFor(s, flow);
    case Stmt::K::kSet:
      return RenderSet(s);
    case Stmt::K::kSetBlock:
      return RenderSetBlock(s);
    case Stmt::K::kMacro:
      Assign(s.name, Value::MakeMacro(&s));
      return true;
    case Stmt::K::kBreak:
      *flow = Flow::kBreak;
      return true;
    case Stmt::K::kContinue:
      *flow = Flow::kContinue;
      return true;
    case Stmt::K::kBlock:
      return RenderBody(s.body, flow);
    case Stmt::K::kDo: {
      Value v;
      return Eval(*s.expr, &v);
    }
    case Stmt::K::kFilterBlock:
      return RenderFilterBlock(s);
    case Stmt::K::kCallBlock:
      return RenderCallBlock(s);
    case Stmt::K::kWith:
      return RenderWith(s, flow);
  }
  return true;
}

bool Renderer::RenderIf(const Stmt& s, Flow* flow) {
  for (const auto& [cond, body] : s.branches) {
    bool take = true;
    if (cond) {
      Value c;
      JINJA_TRY(Eval(*cond, &c));
      take = c.Truthy();
    }
    if (take) return RenderBody(body, flow);
  }
  return true;
}

// {% set %}: one name, several names unpacked from a list, or a namespace's attribute.
bool Renderer::RenderSet(const Stmt& s) {
  Value v;
  JINJA_TRY(Eval(*s.expr, &v));
  const Value* target = s.attr.empty() ? nullptr : Lookup(s.vars[0]);
  JINJA_TRY(CheckStored(s.pos, v,
                        target != nullptr && target->is_object() ? &target->object() : nullptr, 0));
  if (s.vars.size() > 1) {
    if (!v.is_array() || v.array().size() != s.vars.size()) {
      return Fail(s.pos, "cannot unpack a value into " + std::to_string(s.vars.size()) + " names");
    }
    for (size_t i = 0; i < s.vars.size(); ++i) Assign(s.vars[i], v.array()[i]);
    return true;
  }
  if (s.attr.empty()) {
    Assign(s.vars[0], std::move(v));
    return true;
  }
  if (target == nullptr || !target->is_object()) {
    return Fail(s.pos, "'" + s.vars[0] + "' is not a namespace");
  }
  Value ns = *target;  // shares the object
  ns.Set(s.attr, std::move(v));
  return true;
}

// {% set x %}...{% endset %}: the body's text, through the filter chain when there is one.
bool Renderer::RenderSetBlock(const Stmt& s) {
  std::string text;
  JINJA_TRY(Capture(s.body, &text));
  if (!s.expr) {
    Assign(s.vars[0], Value(std::move(text)));
    return true;
  }
  block_value_ = std::move(text);
  Value v;
  JINJA_TRY(Eval(*s.expr, &v));
  block_value_.clear();
  Assign(s.vars[0], std::move(v));
  return true;
}

bool Renderer::RenderFilterBlock(const Stmt& s) {
  std::string text;
  JINJA_TRY(Capture(s.body, &text));
  // The chain's first filter reads the text before any of its arguments is evaluated,
  // so a filter block inside an argument cannot replace it first.
  block_value_ = std::move(text);
  Value v;
  JINJA_TRY(Eval(*s.expr, &v));
  block_value_.clear();
  return EmitValue(s.pos, v);
}

// {% with %}: the body in a frame of its own variables.
bool Renderer::RenderWith(const Stmt& s, Flow* flow) {
  Frame f;
  for (size_t i = 0; i < s.vars.size(); ++i) {
    Value v;
    JINJA_TRY(Eval(*s.defaults[i], &v));
    JINJA_TRY(CheckStored(s.pos, v, nullptr, 0));
    f.emplace_back(s.vars[i], std::move(v));
  }
  frames_.push_back(std::move(f));
  struct Pop {
    ~Pop() { r->frames_.pop_back(); }
    Renderer* r;
  } pop{this};
  return RenderBody(s.body, flow);
}

// {% call(params) macro(args) %}body{% endcall %}: the macro runs with `caller` bound to the
// body, which renders in a copy of the variables seen at the call block.
bool Renderer::RenderCallBlock(const Stmt& s) {
  const Expr& call = *s.expr;
  const Expr& callee = *call.args[0];
  Value fn;
  if (callee.k == Expr::K::kAttr) {
    Value obj;
    JINJA_TRY(Eval(*callee.args[0], &obj));
    if (const Value* m = obj.Find(callee.name)) fn = *m;
  } else {
    JINJA_TRY(Eval(callee, &fn));
  }
  if (!fn.is_macro()) return Fail(call.pos, "'call' needs a macro to call");
  Args args;
  JINJA_TRY(EvalArgs(call, 1, &args));
  Frame scope;
  auto add = [&](const Frame& f) {
    for (const auto& [k, v] : f) {
      bool found = false;
      for (auto& [k2, v2] : scope) {
        if (k2 == k) {
          v2 = v;
          found = true;
          break;
        }
      }
      if (!found) scope.emplace_back(k, v);
    }
  };
  if (floor_ > 0) add(frames_[0]);
  for (size_t i = floor_; i < frames_.size(); ++i) add(frames_[i]);
  JINJA_TRY(Charge(s.pos, static_cast<int64_t>(scope.size() * scope.size() / 16 + 1)));
  callers_.push_back(CallerScope{&s, std::move(scope)});
  Value out;
  const bool ok = CallMacro(call.pos, fn, args, &out, &s);
  callers_.pop_back();
  JINJA_TRY(ok);
  return EmitValue(s.pos, out);
}

bool Renderer::Iterable(size_t pos, const Value& v, Array* items) {
  if (v.is_array()) {
    *items = v.array();
  } else if (v.is_object()) {
    for (const auto& [k, unused] : v.object()) items->emplace_back(k);
  } else if (v.is_string()) {
    for (char c : v.str()) items->emplace_back(std::string(1, c));
  } else if (v.is_undefined() || v.is_none()) {
    if (v.is_none()) return Fail(pos, "'None' is not iterable");
  } else {
    return Fail(pos, "a value of this type is not iterable");
  }
  return true;
}

bool Renderer::RenderFor(const Stmt& s, Flow* flow) {
  Value seq;
  JINJA_TRY(Eval(*s.expr, &seq));
  return RenderLoop(s, s.expr->pos, seq, 1, flow);
}

// One level of a for loop over `seq`; depth is 1 for the loop itself and one more for each
// loop(...) call of a recursive loop.
bool Renderer::RenderLoop(const Stmt& s, size_t pos, const Value& seq, int64_t depth, Flow* flow) {
  Array items;
  JINJA_TRY(Iterable(pos, seq, &items));
  frames_.emplace_back();
  loops_.push_back(ActiveLoop{&s, Value(), depth, Value(), false});
  struct Pop {
    ~Pop() {
      r->frames_.pop_back();
      r->loops_.pop_back();
    }
    Renderer* r;
  } pop{this};
  auto bind = [&](const Value& item) -> bool {
    if (s.vars.size() == 1) {
      Assign(s.vars[0], item);
      return true;
    }
    if (!item.is_array() || item.array().size() != s.vars.size()) {
      return Fail(
          s.pos, "cannot unpack an item into " + std::to_string(s.vars.size()) + " loop variables");
    }
    for (size_t i = 0; i < s.vars.size(); ++i) Assign(s.vars[i], item.array()[i]);
    return true;
  };
  if (s.cond) {  // `for x in xs if cond`: the loop sees only the items that pass
    Array kept;
    for (const Value& item : items) {
      JINJA_TRY(CountIteration(s.pos));
      JINJA_TRY(bind(item));
      Value c;
      JINJA_TRY(Eval(*s.cond, &c));
      if (c.Truthy()) kept.push_back(item);
    }
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    JINJA_TRY(CountIteration(s.pos));
    JINJA_TRY(bind(items[i]));
    Object loop = {{"index", Value(i + 1)},
                   {"index0", Value(i)},
                   {"revindex", Value(n - i)},
                   {"revindex0", Value(n - i - 1)},
                   {"first", Value(i == 0)},
                   {"last", Value(i == n - 1)},
                   {"length", Value(n)},
                   {"previtem", i > 0 ? items[i - 1] : Value()},
                   {"nextitem", i + 1 < n ? items[i + 1] : Value()},
                   {"depth", Value(depth)},
                   {"depth0", Value(depth - 1)}};
    Value lv = Value::MakeObject(std::move(loop));
    loops_.back().obj = lv;
    Assign("loop", std::move(lv));
    Flow f = Flow::kNormal;
    JINJA_TRY(RenderBody(s.body, &f));
    if (f == Flow::kBreak) break;
  }
  if (n == 0) return RenderBody(s.else_body, flow);
  return true;
}

// ---- expressions

bool Renderer::Eval(const Expr& e, Value* out) {
  DepthGuard g(&depth_);
  JINJA_TRY(CheckDepth(e.pos));
  JINJA_TRY(Charge(e.pos, 1));
  switch (e.k) {
    case Expr::K::kLiteral:
      *out = e.lit;
      return true;
    case Expr::K::kName: {
      const Value* v = Lookup(e.name);
      *out = v != nullptr ? *v : Value();
      return true;
    }
    case Expr::K::kAttr: {
      Value obj;
      JINJA_TRY(Eval(*e.args[0], &obj));
      const Value* v = obj.Find(e.name);
      *out = v != nullptr ? *v : Value();
      return true;
    }
    case Expr::K::kItem: {
      Value obj, key;
      JINJA_TRY(Eval(*e.args[0], &obj));
      JINJA_TRY(Eval(*e.args[1], &key));
      return GetItem(obj, key, out);
    }
    case Expr::K::kSlice:
      return EvalSlice(e, out);
    case Expr::K::kCall:
      return EvalCall(e, out);
    case Expr::K::kFilter:
      return EvalFilter(e, out);
    case Expr::K::kTest: {
      bool r = false;
      JINJA_TRY(EvalTest(e, &r));
      *out = Value(r != e.negated);
      return true;
    }
    case Expr::K::kUnary:
      return EvalUnary(e, out);
    case Expr::K::kAnd:
    case Expr::K::kOr: {
      Value a;
      JINJA_TRY(Eval(*e.args[0], &a));
      if (a.Truthy() == (e.k == Expr::K::kOr)) {
        *out = std::move(a);
        return true;
      }
      return Eval(*e.args[1], out);
    }
    case Expr::K::kTernary: {
      Value c;
      JINJA_TRY(Eval(*e.args[0], &c));
      if (c.Truthy()) return Eval(*e.args[1], out);
      if (e.args[2]) return Eval(*e.args[2], out);
      *out = Value();
      return true;
    }
    case Expr::K::kList:
      return EvalList(e, out);
    case Expr::K::kDict:
      return EvalDict(e, out);
    case Expr::K::kBinary:
      return EvalBinary(e, out);
    case Expr::K::kBlockValue:
      *out = Value(block_value_);
      return true;
  }
  return Fail(e.pos, "bad expression");
}

// not x, -x, +x.
bool Renderer::EvalUnary(const Expr& e, Value* out) {
  Value x;
  JINJA_TRY(Eval(*e.args[0], &x));
  if (e.name == "not") {
    *out = Value(!x.Truthy());
    return true;
  }
  if (x.is_bool()) x = Value(static_cast<int64_t>(x.as_bool()));
  if (x.is_int()) {
    if (e.name == "-" && x.as_int() == std::numeric_limits<int64_t>::min()) {
      return Fail(e.pos, "integer overflow");
    }
    *out = Value(e.name == "-" ? -x.as_int() : x.as_int());
    return true;
  }
  if (x.is_float()) {
    *out = Value(e.name == "-" ? -x.as_double() : x.as_double());
    return true;
  }
  return Fail(e.pos, "bad operand for unary '" + e.name + "'");
}

bool Renderer::EvalList(const Expr& e, Value* out) {
  Array a;
  for (const auto& x : e.args) {
    Value v;
    JINJA_TRY(Eval(*x, &v));
    a.push_back(std::move(v));
  }
  *out = Value::MakeArray(std::move(a));
  return true;
}

// A dict literal; keys that are not strings are printed.
bool Renderer::EvalDict(const Expr& e, Value* out) {
  *out = Value::MakeObject();
  for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
    Value k, v;
    JINJA_TRY(Eval(*e.args[i], &k));
    JINJA_TRY(Eval(*e.args[i + 1], &v));
    if (!k.is_string()) {
      std::string ks;
      PyStr(k, &ks);
      k = Value(ks);
    }
    out->Set(k.str(), std::move(v));
  }
  return true;
}

bool Renderer::GetItem(const Value& obj, const Value& key, Value* out) {
  *out = Value();
  if (obj.is_object()) {
    std::string k;
    if (key.is_string()) {
      k = key.str();
    } else {
      PyStr(key, &k);
    }
    if (const Value* v = obj.Find(k)) *out = *v;
  } else if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                     : static_cast<int64_t>(obj.str().size());
    int64_t i = key.is_bool() ? key.as_bool() : key.as_int();
    if (i < 0) i += n;
    if (i >= 0 && i < n) {
      *out = obj.is_array() ? obj.array()[i] : Value(std::string(1, obj.str()[i]));
    }
  }
  return true;
}

bool Renderer::SliceIndex(const Expr* e, int64_t* out, bool* given) {
  *given = false;
  if (e == nullptr) return true;
  Value v;
  JINJA_TRY(Eval(*e, &v));
  if (v.is_none()) return true;
  if (!v.is_int()) return Fail(e->pos, "slice indices must be integers");
  *out = v.as_int();
  *given = true;
  return true;
}

bool Renderer::EvalSlice(const Expr& e, Value* out) {
  Value obj;
  JINJA_TRY(Eval(*e.args[0], &obj));
  int64_t start = 0, stop = 0, step = 1;
  bool has_start, has_stop, has_step;
  JINJA_TRY(SliceIndex(e.args[1].get(), &start, &has_start));
  JINJA_TRY(SliceIndex(e.args[2].get(), &stop, &has_stop));
  JINJA_TRY(SliceIndex(e.args[3].get(), &step, &has_step));
  if (!has_step) step = 1;
  if (step == 0) return Fail(e.pos, "slice step cannot be zero");
  if (!obj.is_array() && !obj.is_string()) {
    *out = Value();
    return true;
  }
  const int64_t n = obj.is_array() ? static_cast<int64_t>(obj.array().size())
                                   : static_cast<int64_t>(obj.str().size());
  // Python's slice.indices.
  auto fix = [&](int64_t v, bool given, int64_t dflt) {
    if (!given) return dflt;
    if (v < 0) {
      v += n;
      if (v < 0) v = step < 0 ? -1 : 0;
    } else if (v >= n) {
      v = step < 0 ? n - 1 : n;
    }
    return v;
  };
  start = fix(start, has_start, step < 0 ? n - 1 : 0);
  stop = fix(stop, has_stop, step < 0 ? -1 : n);
  Array a;
  std::string s;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (obj.is_array()) {
      a.push_back(obj.array()[i]);
    } else {
      s.push_back(obj.str()[i]);
    }
  }
  JINJA_TRY(Charge(e.pos, static_cast<int64_t>(a.size() + s.size() / 16)));
  *out = obj.is_array() ? Value::MakeArray(std::move(a)) : Value(std::move(s));
  return true;
}

bool Renderer::Equal(const Value& a, const Value& b) {
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    auto num = [](const Value& v) {
      return v.is_bool() ? static_cast<double>(v.as_bool()) : v.as_double();
    };
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      return (a.is_bool() ? a.as_bool() : a.as_int()) == (b.is_bool() ? b.as_bool() : b.as_int());
    }
    return num(a) == num(b);
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kArray: {
      if (a.array().size() != b.array().size()) return false;
      for (size_t i = 0; i < a.array().size(); ++i) {
        if (!Equal(a.array()[i], b.array()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kObject: {
      if (a.object().size() != b.object().size()) return false;
      for (const auto& [k, v] : a.object()) {
        const Value* w = b.Find(k);
        if (w == nullptr || !Equal(v, *w)) return false;
      }
      return true;
    }
    case Value::Kind::kMacro:
      return a.macro() == b.macro();
    default:
      return true;  // undefined == undefined, none == none
  }
}

// -1, 0, 1; false when the values do not order.
bool Renderer::Compare(const Value& a, const Value& b, int* cmp) {
  const bool an = a.is_number() || a.is_bool(), bn = b.is_number() || b.is_bool();
  if (an && bn) {
    if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) {
      const int64_t x = a.is_bool() ? a.as_bool() : a.as_int();
      const int64_t y = b.is_bool() ? b.as_bool() : b.as_int();
      *cmp = x < y ? -1 : x > y ? 1 : 0;
      return true;
    }
    const double x = a.is_bool() ? a.as_bool() : a.as_double();
    const double y = b.is_bool() ? b.as_bool() : b.as_double();
    *cmp = x < y ? -1 : x > y ? 1 : 0;
    return true;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    *cmp = c < 0 ? -1 : c > 0 ? 1 : 0;
    return true;
  }
  if (a.is_array() && b.is_array()) {
    const size_t n = std::min(a.array().size(), b.array().size());
    for (size_t i = 0; i < n; ++i) {
      if (!Compare(a.array()[i], b.array()[i], cmp)) return false;
      if (*cmp != 0) return true;
    }
    *cmp = a.array().size() < b.array().size() ? -1 : a.array().size() > b.array().size() ? 1 : 0;
    return true;
  }
  return false;
}

bool Renderer::Contains(size_t pos, const Value& hay, const Value& needle, bool* r) {
  *r = false;
  if (hay.is_string()) {
    if (!needle.is_string()) return Fail(pos, "'in <string>' needs a string on the left");
    *r = hay.str().find(needle.str()) != std::string::npos;
  } else if (hay.is_array()) {
    for (const Value& v : hay.array()) {
      if (Equal(v, needle)) {
        *r = true;
        break;
      }
    }
  } else if (hay.is_object()) {
    *r = needle.is_string() && hay.Find(needle.str()) != nullptr;
  } else if (!hay.is_undefined() && !hay.is_none()) {
    return Fail(pos, "the right side of 'in' is not a container");
  } else if (hay.is_none()) {
    return Fail(pos, "argument of type 'NoneType' is not iterable");
  }
  return true;
}

bool Renderer::Arith(size_t pos, const std::string& op, Value a, Value b, Value* out) {
  if (op == "%" && a.is_string()) return PercentFormat(pos, a.str(), b, out);
  if (a.is_bool()) a = Value(static_cast<int64_t>(a.as_bool()));
  if (b.is_bool()) b = Value(static_cast<int64_t>(b.as_bool()));
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      JINJA_TRY(CheckSize(pos, a.str().size() + b.str().size()));
      *out = Value(a.str() + b.str());
      return true;
    }
    if (a.is_array() && b.is_array()) {
      JINJA_TRY(CheckCount(pos, static_cast<int64_t>(a.array().size() + b.array().size())));
      Array r = a.array();
      r.insert(r.end(), b.array().begin(), b.array().end());
      *out = Value::MakeArray(std::move(r));
      return true;
    }
  }
  if (op == "*" && ((a.is_string() || a.is_array()) && b.is_int())) std::swap(a, b);
  if (op == "*" && a.is_int() && (b.is_string() || b.is_array())) {
    const int64_t n = std::max<int64_t>(0, a.as_int());
    if (b.is_string()) {
      if (n > 0 && b.str().size() > lim_.max_output_bytes / static_cast<uint64_t>(n)) {
        return CheckSize(pos, lim_.max_output_bytes + 1);
      }
      JINJA_TRY(CheckSize(pos, b.str().size() * n));
      std::string r;
      for (int64_t i = 0; i < n; ++i) r += b.str();
      *out = Value(std::move(r));
    } else {
      if (n > 0 && b.array().size() > static_cast<uint64_t>(lim_.max_loop_iterations) / n) {
        return CheckCount(pos, lim_.max_loop_iterations + 1);
      }
      JINJA_TRY(CheckCount(pos, static_cast<int64_t>(b.array().size()) * n));
      Array r;
      for (int64_t i = 0; i < n; ++i) r.insert(r.end(), b.array().begin(), b.array().end());
      *out = Value::MakeArray(std::move(r));
    }
    return true;
  }
  if (!a.is_number() || !b.is_number()) {
    return Fail(pos, "unsupported operand types for '" + op + "'");
  }
  if (a.is_int() && b.is_int() && op != "/") {
    return IntArith(pos, op, a.as_int(), b.as_int(), out);
  }
  return FloatArith(pos, op, a.as_double(), b.as_double(), out);
}

// Integer + - * // % **: Python's floor division and modulo, overflow an error, a negative
// exponent a float.
bool Renderer::IntArith(size_t pos, const std::string& op, int64_t x, int64_t y, Value* out) {
  int64_t r = 0;
  if (op == "+") {
    if (__builtin_add_overflow(x, y, &r)) return Fail(pos, "integer overflow");
  } else if (op == "-") {
    if (__builtin_sub_overflow(x, y, &r)) return Fail(pos, "integer overflow");
  } else if (op == "*") {
    if (__builtin_mul_overflow(x, y, &r)) return Fail(pos, "integer overflow");
  } else if (op == "//" || op == "%") {
    if (y == 0) return Fail(pos, "division by zero");
    if (x == std::numeric_limits<int64_t>::min() && y == -1) {
      if (op == "%") {
        r = 0;
      } else {
        return Fail(pos, "integer overflow");
      }
    } else {
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      r = op == "//" ? q : m;
    }
  } else if (op == "**") {
    if (y < 0) {
      *out = Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
      return true;
    }
    r = 1;
    for (int64_t i = 0; i < y; ++i) {
      if (__builtin_mul_overflow(r, x, &r)) return Fail(pos, "integer overflow");
      if (r == 0 || r == 1) break;
      if (r == -1) {
        r = (y % 2 == 0) ? 1 : -1;
        break;
      }
    }
  }
  *out = Value(r);
  return true;
}

bool Renderer::FloatArith(size_t pos, const std::string& op, double x, double y, Value* out) {
  double r = 0;
  if (op == "+") {
    r = x + y;
  } else if (op == "-") {
    r = x - y;
  } else if (op == "*") {
    r = x * y;
  } else if (op == "/") {
    if (y == 0) return Fail(pos, "division by zero");
    r = x / y;
  } else if (op == "//") {
    if (y == 0) return Fail(pos, "division by zero");
    r = std::floor(x / y);
  } else if (op == "%") {
    if (y == 0) return Fail(pos, "division by zero");
    r = std::fmod(x, y);
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
  } else if (op == "**") {
    r = std::pow(x, y);
  }
  *out = Value(r);
  return true;
}

bool Renderer::EvalBinary(const Expr& e, Value* out) {
  Value a, b;
  JINJA_TRY(Eval(*e.args[0], &a));
  JINJA_TRY(Eval(*e.args[1], &b));
  const std::string& op = e.name;
  if (op == "~") {
    std::string s;
    PyStr(a, &s);
    PyStr(b, &s);
    JINJA_TRY(CheckSize(e.pos, s.size()));
    *out = Value(std::move(s));
    return true;
  }
  if (op == "==" || op == "!=") {
    *out = Value(Equal(a, b) == (op == "=="));
    return true;
  }
  if (op == "in" || op == "not in") {
    bool r = false;
    JINJA_TRY(Contains(e.pos, b, a, &r));
    *out = Value(r == (op == "in"));
    return true;
  }
  if (op == "<" || op == "<=" || op == ">" || op == ">=") {
    int c = 0;
    if (!Compare(a, b, &c)) return Fail(e.pos, "cannot compare these values with '" + op + "'");
    *out = Value(op == "<" ? c < 0 : op == "<=" ? c <= 0 : op == ">" ? c > 0 : c >= 0);
    return true;
  }
  return Arith(e.pos, op, std::move(a), std::move(b), out);
}

// ---- calls

bool Renderer::EvalArgs(const Expr& e, size_t first, Args* args) {
  for (size_t i = first; i < e.args.size(); ++i) {
    Value v;
    JINJA_TRY(Eval(*e.args[i], &v));
    args->pos.push_back(std::move(v));
  }
  for (const auto& [k, x] : e.kwargs) {
    Value v;
    JINJA_TRY(Eval(*x, &v));
    args->kw.emplace_back(k, std::move(v));
  }
  return true;
}

bool Renderer::EvalCall(const Expr& e, Value* out) {
  const Expr& callee = *e.args[0];
  Args args;
  if (callee.k == Expr::K::kAttr) {
    Value obj;
    JINJA_TRY(Eval(*callee.args[0], &obj));
    JINJA_TRY(EvalArgs(e, 1, &args));
    if (ActiveLoop* l = FindLoop(obj)) {
      if (callee.name == "cycle" || callee.name == "changed") {
        return LoopMethod(e.pos, l, obj, callee.name, args, out);
      }
    }
    const Value* member = obj.Find(callee.name);
    if (member != nullptr && member->is_macro()) return CallMacro(e.pos, *member, args, out);
    return CallMethod(e.pos, obj, callee.name, args, out);
  }
  Value fn;
  JINJA_TRY(Eval(callee, &fn));
  JINJA_TRY(EvalArgs(e, 1, &args));
  if (fn.is_macro()) return CallMacro(e.pos, fn, args, out);
  if (const ActiveLoop* l = FindLoop(fn)) return RecurseLoop(e.pos, *l, args, out);
  if (callee.k == Expr::K::kName && fn.is_undefined()) {
    return CallGlobal(e.pos, callee.name, args, out);
  }
  return Fail(e.pos, "the value called is not callable");
}

// The loop in progress whose `loop` object `v` is (nullptr when it is none).
Renderer::ActiveLoop* Renderer::FindLoop(const Value& v) {
  if (!v.is_object()) return nullptr;
  for (size_t i = loops_.size(); i-- > 0;) {
    if (loops_[i].obj.is_object() && &loops_[i].obj.object() == &v.object()) return &loops_[i];
  }
  return nullptr;
}

bool Renderer::LoopMethod(size_t pos, ActiveLoop* l, const Value& loop, const std::string& name,
                          const Args& args, Value* out) {
  if (name == "cycle") {
    if (args.pos.empty()) return Fail(pos, "loop.cycle() takes at least one value");
    const Value* i = loop.Find("index0");
    const int64_t k = i != nullptr && i->is_int() ? i->as_int() : 0;
    *out = args.pos[static_cast<size_t>(k) % args.pos.size()];
    return true;
  }
  // changed(*values): true on the first call and whenever the values differ from the last.
  Value now = Value::MakeArray(args.pos);
  *out = Value(!l->has_last || !Equal(l->last, now));
  l->last = std::move(now);
  l->has_last = true;
  return true;
}

// loop(items) inside a recursive loop: the loop's body over items, one level deeper.
bool Renderer::RecurseLoop(size_t pos, const ActiveLoop& l, const Args& args, Value* out) {
  if (!l.s->recursive) {
    return Fail(pos,
                "loop() is called in a loop that is not recursive (add 'recursive' to its "
                "'for')");
  }
  if (args.pos.size() != 1 || !args.kw.empty()) {
    return Fail(pos, "loop() takes one iterable");
  }
  if (call_depth_ >= lim_.max_call_depth) {
    return Fail(pos, "recursive loop calls nest deeper than the limit of " +
                         std::to_string(lim_.max_call_depth));
  }
  JINJA_TRY(CheckStored(pos, args.pos[0], nullptr, 0));
  const Stmt& s = *l.s;
  const int64_t depth = l.depth + 1;
  ++call_depth_;
  std::string saved = std::move(out_);
  out_.clear();
  Flow flow = Flow::kNormal;
  const bool ok = RenderLoop(s, pos, args.pos[0], depth, &flow);
  std::string text = std::move(out_);
  out_ = std::move(saved);
  --call_depth_;
  JINJA_TRY(ok);
  *out = Value(std::move(text));
  return true;
}

// Calls a macro, or a call block's body (caller()). `caller_block`: the call block whose
// body the macro's `caller` renders.
bool Renderer::CallMacro(size_t pos, const Value& fn, const Args& args, Value* out,
                         const Stmt* caller_block) {
  const Stmt& m = *static_cast<const Stmt*>(fn.macro());
  if (call_depth_ >= lim_.max_call_depth) {
    return Fail(pos, std::string(m.k == Stmt::K::kCallBlock ? "caller() and macro" : "macro") +
                         " calls nest deeper than the limit of " +
                         std::to_string(lim_.max_call_depth));
  }
  const size_t base = frames_.size();
  if (m.k == Stmt::K::kCallBlock) {
    const CallerScope* scope = nullptr;
    for (size_t i = callers_.size(); i-- > 0;) {
      if (callers_[i].s == &m) {
        scope = &callers_[i];
        break;
      }
    }
    if (scope == nullptr) return Fail(pos, "caller() is called outside its 'call' block");
    JINJA_TRY(Charge(pos, static_cast<int64_t>(scope->frame.size())));
    Frame copy = scope->frame;
    frames_.push_back(std::move(copy));
  }
  Frame frame;
  for (size_t i = 0; i < m.params.size(); ++i) {
    const Value* v = args.Get(i, m.params[i]);
    if (v != nullptr) {
      JINJA_TRY(CheckStored(pos, *v, nullptr, 0));  // depth could grow call by call
      frame.emplace_back(m.params[i], *v);
    } else if (m.defaults[i]) {
      Value d;
      JINJA_TRY(Eval(*m.defaults[i], &d));
      frame.emplace_back(m.params[i], std::move(d));
    } else {
      frame.emplace_back(m.params[i], Value());
    }
  }
  if (caller_block != nullptr) frame.emplace_back("caller", Value::MakeMacro(caller_block));
  const size_t saved_floor = floor_;
  frames_.push_back(std::move(frame));
  floor_ = base;
  ++call_depth_;
  std::string text;
  const bool ok = Capture(m.body, &text);
  --call_depth_;
  frames_.resize(base);
  floor_ = saved_floor;
  JINJA_TRY(ok);
  *out = Value(std::move(text));
  return true;
}

}  // namespace internal

Result<std::string> Template::Render(const Value& context, const RenderOptions& options) const {
  LAMINA_CHECK(impl_ != nullptr);
  const Value empty = Value::MakeObject();
  internal::Renderer r(*impl_, context.is_object() ? context : empty, options);
  std::string out;
  if (!r.Run(&out)) return r.error();
  return out;
}

}  // namespace lamina::chat::jinja
