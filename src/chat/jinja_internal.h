// Internals of the Jinja engine (jinja.h) shared by its files: character classes, Python's
// printing of values, the tokens, the AST, Template::Impl and the Renderer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chat/jinja.h"
#include "util/status.h"

// Returns false from the enclosing function when `x` is false (an error is already recorded).
#define JINJA_TRY(x)        \
  do {                      \
    if (!(x)) return false; \
  } while (0)

namespace lamina::chat::jinja {
namespace internal {

inline bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
inline bool IsNameStart(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
inline bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Appends code point `cp` as UTF-8 (jinja_lexer.cpp).
void AppendUtf8(uint32_t cp, std::string* s);

// Python's str() and repr() of a value, appended to *out; ToStr returns str() (jinja_value.cpp).
void PyStr(const Value& v, std::string* out);
void PyRepr(const Value& v, std::string* out);
std::string ToStr(const Value& v);

// ---------------------------------------------------------------------------------------------
// Tokens (jinja_lexer.cpp)

enum class Tok {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // text, name, string value or operator
  int64_t i = 0;
  double f = 0.0;
  size_t pos = 0;  // offset in the source
};

// Line and column (1-based) of source offsets.
class Positions {
 public:
  explicit Positions(std::string_view src);
  std::string Where(size_t pos) const;

 private:
  std::vector<size_t> starts_;
};

// The tokens of a template: text, tag delimiters and the tokens inside tags, then kEof;
// whitespace control (trim_blocks, lstrip_blocks, '-' / '+') and raw blocks applied.
Result<std::vector<Token>> Lex(std::string_view src, const Positions& pos);

// ---------------------------------------------------------------------------------------------
// AST (built by jinja_parser.cpp, walked by the Renderer)

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    kLiteral,
    kName,
    kAttr,    // args[0].name
    kItem,    // args[0][args[1]]
    kSlice,   // args[0][args[1]:args[2]:args[3]] (null parts)
    kCall,    // args[0](args[1..], kwargs)
    kFilter,  // args[0] | name(args[1..], kwargs)
    kTest,    // args[0] is [not] name(args[1..])
    kUnary,   // op args[0]: "-", "+", "not"
    kBinary,  // args[0] op args[1]
    kAnd,
    kOr,
    kTernary,  // args[1] if args[0] else args[2] (null: undefined)
    kList,
    kDict,        // args: key, value, key, value, ...
    kBlockValue,  // the text a {% filter %} block rendered (the start of its filter chain)
  };
  K k;
  size_t pos;
  Value lit;
  std::string name;  // name, attribute, filter or test, operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class K {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kBlock,
    kDo,
    kFilterBlock,  // {% filter f|g(x) %}: expr is the chain applied to the body's text
    kCallBlock,    // {% call(params) macro(args) %}: expr is the call, body is caller()
    kWith,         // {% with a = 1, b = 2 %}: vars and defaults hold the names and values
  };
  K k;
  size_t pos;
  std::string text;                                // kText
  ExprPtr expr;                                    // output, set value, for iterable, do
  std::vector<std::pair<ExprPtr, Body>> branches;  // kIf: condition (null: else) and body
  std::vector<std::string> vars;                   // for targets; set target (one name)
  std::string attr;                                // set ns.attr
  ExprPtr cond;                                    // for ... if cond
  Body body, else_body;
  std::string name;  // macro
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // per param, null when none
  bool recursive = false;         // for ... recursive
};

}  // namespace internal

struct Template::Impl {
  std::string source;
  Limits limits;
  std::unique_ptr<internal::Positions> positions;
  internal::Body body;
};

namespace internal {

// ---------------------------------------------------------------------------------------------
// Renderer

enum class Flow { kNormal, kBreak, kContinue };

// One render of a template: walks the AST over the context's variables and counts every step,
// item and byte against the template's limits; the first failure is kept as the error.
// jinja_render.cpp holds statements, expressions, operators, loops, macros and calls;
// jinja_filters.cpp the filters, tests, global functions, string and dict methods and the
// printf-style % formatting.
class Renderer {
  using Impl = Template::Impl;

 public:
  Renderer(const Impl& impl, const Value& context, const RenderOptions& options);

  bool Run(std::string* out);
  const Error& error() const { return err_; }

 private:
  using Frame = std::vector<std::pair<std::string, Value>>;
  struct ActiveLoop {
    const Stmt* s;
    Value obj;  // its `loop` object of this iteration (kept alive: compared by address)
    int64_t depth;
    Value last;  // loop.changed()'s last values
    bool has_last;
  };
  struct CallerScope {
    const Stmt* s;  // the call block
    Frame frame;    // the variables its body sees
  };
  struct DepthGuard {
    explicit DepthGuard(int* d) : d(d) { ++*d; }
    ~DepthGuard() { --*d; }
    int* d;
  };
  // The arguments of a call: positional, then keyword.
  struct Args {
    Array pos;
    Object kw;
    const Value* Get(size_t i, std::string_view name) const {
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return i < pos.size() ? &pos[i] : nullptr;
    }
  };
  // One conversion of a printf-style format: %[(key)][flags][width][.precision]conv.
  struct FormatSpec {
    std::string key;
    bool keyed = false;
    bool left = false, plus = false, space = false, alt = false, zero = false;
    int64_t width = 0, prec = -1;
    char conv = '\0';
  };

  // ---- limits (jinja_render.cpp)
  bool Fail(size_t pos, const std::string& what);
  bool Charge(size_t pos, int64_t units);
  bool CheckSize(size_t pos, size_t n);
  bool CheckCount(size_t pos, int64_t n);
  bool CheckDepth(size_t pos);
  bool CountIteration(size_t pos);
  bool CheckContext();
  bool CheckStored(size_t pos, const Value& v, const Object* forbid, int depth);

  // ---- output and variables
  bool Emit(size_t pos, std::string_view s);
  bool EmitValue(size_t pos, const Value& v);
  bool Capture(const Body& body, std::string* text);
  const Value* Lookup(const std::string& name) const;
  void Assign(const std::string& name, Value v);

  // ---- statements
  bool RenderBody(const Body& body, Flow* flow);
  bool RenderStmt(const Stmt& s, Flow* flow);
  bool RenderIf(const Stmt& s, Flow* flow);
  bool RenderSet(const Stmt& s);
  bool RenderSetBlock(const Stmt& s);
  bool RenderFilterBlock(const Stmt& s);
  bool RenderWith(const Stmt& s, Flow* flow);
  bool RenderCallBlock(const Stmt& s);
  bool Iterable(size_t pos, const Value& v, Array* items);
  bool RenderFor(const Stmt& s, Flow* flow);
  bool RenderLoop(const Stmt& s, size_t pos, const Value& seq, int64_t depth, Flow* flow);

  // ---- expressions
  bool Eval(const Expr& e, Value* out);
  bool EvalUnary(const Expr& e, Value* out);
  bool EvalList(const Expr& e, Value* out);
  bool EvalDict(const Expr& e, Value* out);
  bool GetItem(const Value& obj, const Value& key, Value* out);
  bool SliceIndex(const Expr* e, int64_t* out, bool* given);
  bool EvalSlice(const Expr& e, Value* out);
  static bool Equal(const Value& a, const Value& b);
  static bool Compare(const Value& a, const Value& b, int* cmp);
  bool Contains(size_t pos, const Value& hay, const Value& needle, bool* r);
  bool Arith(size_t pos, const std::string& op, Value a, Value b, Value* out);
  bool IntArith(size_t pos, const std::string& op, int64_t x, int64_t y, Value* out);
  bool FloatArith(size_t pos, const std::string& op, double x, double y, Value* out);
  bool EvalBinary(const Expr& e, Value* out);

  // ---- calls
  bool EvalArgs(const Expr& e, size_t first, Args* args);
  bool EvalCall(const Expr& e, Value* out);
  ActiveLoop* FindLoop(const Value& v);
  bool LoopMethod(size_t pos, ActiveLoop* l, const Value& loop, const std::string& name,
                  const Args& args, Value* out);
  bool RecurseLoop(size_t pos, const ActiveLoop& l, const Args& args, Value* out);
  bool CallMacro(size_t pos, const Value& fn, const Args& args, Value* out,
                 const Stmt* caller_block = nullptr);

  // ---- % formatting (jinja_filters.cpp)
  bool PercentFormat(size_t pos, const std::string& fmt, const Value& values, Value* out,
                     bool exact = false);
  bool ParseFormatSpec(size_t pos, const std::string& fmt, const Array& vals, size_t* next,
                       size_t* i, FormatSpec* spec);
  bool FormatConversion(size_t pos, const FormatSpec& spec, Value v, std::string* body,
                        std::string* sign, bool* numeric);
  bool FormatInteger(size_t pos, const FormatSpec& spec, const Value& v, std::string* body,
                     std::string* sign);
  bool FormatFloat(size_t pos, const FormatSpec& spec, const Value& v, std::string* body,
                   std::string* sign);

  // ---- global functions and methods
  bool CallGlobal(size_t pos, const std::string& name, const Args& args, Value* out);
  bool CallMethod(size_t pos, const Value& obj, const std::string& name, const Args& args,
                  Value* out);
  bool CallStringMethod(size_t pos, const std::string& s, const std::string& name, const Args& args,
                        Value* out);
  bool CallDictMethod(size_t pos, const Value& obj, const std::string& name, const Args& args,
                      Value* out);
  bool StrCountOrFind(size_t pos, const std::string& s, const std::string& name, const Value* a0,
                      Value* out);
  bool StrFormat(size_t pos, const std::string& s, const Args& args, Value* out);
  bool Replace(size_t pos, const std::string& s, const std::string& from, const std::string& to,
               int64_t count, Value* out);
  bool Split(size_t pos, const std::string& s, const Value* sep, int64_t maxsplit, Value* out);

  // ---- filters
  bool Attribute(const Value& item, const std::string& path, Value* out);
  bool SortKey(const Value& x, const Value* attr, const Value* case_sensitive, Value* key);
  bool EvalFilter(const Expr& e, Value* out);
  bool ApplyFilter(size_t pos, const std::string& f, const Value& v, const Args& args, Value* out);
  bool FilterTrim(const Value& v, const Args& args, Value* out);
  bool FilterLength(size_t pos, const Value& v, Value* out);
  bool FilterToJson(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterEscape(const std::string& f, const Value& v, Value* out);
  bool FilterJoin(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterDefault(const Value& v, const Args& args, Value* out);
  bool FilterFirstLast(const std::string& f, const Value& v, Value* out);
  bool FilterReplace(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterInt(const Value& v, const Args& args, Value* out);
  bool FilterFloat(const Value& v, Value* out);
  bool FilterAbs(size_t pos, const Value& v, Value* out);
  bool FilterRound(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterList(size_t pos, const Value& v, Value* out);
  bool FilterItems(size_t pos, const Value& v, Value* out);
  bool FilterReverse(size_t pos, const Value& v, Value* out);
  bool FilterUnique(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterSort(size_t pos, const std::string& f, const Value& v, const Args& args, Value* out);
  bool FilterSelect(size_t pos, const std::string& f, const Value& v, const Args& args, Value* out);
  bool FilterMap(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterIndent(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterAttr(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterSum(size_t pos, const Value& v, Value* out);
  bool FilterMinMax(size_t pos, const std::string& f, const Value& v, const Args& args, Value* out);
  bool FilterBatchOrSlice(size_t pos, const std::string& f, const Value& v, const Args& args,
                          Value* out);
  bool FilterCenter(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterTruncate(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterFormat(size_t pos, const Value& v, const Args& args, Value* out);
  bool FilterWordcount(size_t pos, const Value& v, Value* out);

  // ---- tests
  bool EvalTest(const Expr& e, bool* r);
  bool ApplyTest(size_t pos, const std::string& name, const Value& v, const Array& targs, bool* r);

  const Impl& impl_;
  const Limits& lim_;
  const Value& context_;
  const RenderOptions& options_;
  std::string out_;
  std::vector<Frame> frames_;
  size_t floor_ = 0;         // frames below this (except the template's own, 0) are a caller's
  std::string block_value_;  // the text of the {% filter %} block being filtered
  std::vector<ActiveLoop> loops_;     // loops in progress, innermost last
  std::vector<CallerScope> callers_;  // call blocks in progress, innermost last
  int depth_ = 0;
  int call_depth_ = 0;
  int64_t iterations_ = 0;
  int64_t work_ = 0;
  Error err_;
};

}  // namespace internal
}  // namespace lamina::chat::jinja
