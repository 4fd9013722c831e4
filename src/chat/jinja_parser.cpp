// The Jinja parser: recursive descent from tokens to the AST, with nesting and chain limits,
// and Template::Parse.
#include <algorithm>
#include <initializer_list>

#include "chat/jinja.h"
#include "chat/jinja_internal.h"

namespace lamina::chat::jinja {
namespace internal {
namespace {

class Parser {
 public:
  Parser(const std::vector<Token>& toks, const Positions& pos, const Limits& limits)
      : t_(toks), pos_(pos), limits_(limits) {}

  bool ParseTemplate(Body* out) {
    std::string stop;
    if (!ParseBody(out, {}, &stop, nullptr)) return false;
    return true;
  }
  const Error& error() const { return err_; }

 private:
  const Token& Peek(int ahead = 0) const {
    const size_t i = std::min(p_ + ahead, t_.size() - 1);
    return t_[i];
  }
  const Token& Next() {
    const Token& t = t_[p_];
    if (p_ + 1 < t_.size()) ++p_;
    return t;
  }
  bool IsOp(std::string_view op, int ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == Tok::kOp && t.text == op;
  }
  bool IsName(std::string_view n, int ahead = 0) const {
    const Token& t = Peek(ahead);
    return t.type == Tok::kName && t.text == n;
  }
  bool Fail(size_t at, const std::string& what) {
    if (err_.message.empty()) err_.message = pos_.Where(at) + ": " + what;
    return false;
  }
  bool Expect(std::string_view op) {
    if (IsOp(op)) {
      Next();
      return true;
    }
    return Fail(Peek().pos, "expected '" + std::string(op) + "'" + Found());
  }
  std::string Found() const {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kName:
      case Tok::kOp:
        return ", found '" + t.text + "'";
      case Tok::kString:
        return ", found a string";
      case Tok::kInt:
      case Tok::kFloat:
        return ", found a number";
      case Tok::kBlockEnd:
        return ", found the end of the tag";
      case Tok::kVarEnd:
        return ", found '}}'";
      case Tok::kEof:
        return ", found the end of the template";
      default:
        return "";
    }
  }
  bool ExpectBlockEnd() {
    if (Peek().type == Tok::kBlockEnd) {
      Next();
      return true;
    }
    return Fail(Peek().pos, "expected the end of the tag ('%}')" + Found());
  }
  bool ExpectName(std::string* out) {
    if (Peek().type != Tok::kName) return Fail(Peek().pos, "expected a name" + Found());
    *out = Next().text;
    return true;
  }

  struct Depth {
    explicit Depth(Parser* p) : p(p) { ++p->depth_; }
    ~Depth() { --p->depth_; }
    Parser* p;
  };
  // Chains of operators, postfixes and filters (a + b + c, x.y[0].z, x|f|g) build left-deep
  // trees: the links along the current path count against four times the nesting limit (what
  // rendering allows), so the tree stays shallow enough to walk and free recursively.
  struct Chain {
    explicit Chain(Parser* p) : p(p), saved(p->links_) {}
    ~Chain() { p->links_ = saved; }
    bool Link(size_t at) {
      if (++p->links_ > p->limits_.max_nesting * 4) {
        return p->Fail(at, "an expression chains more operations than the limit of " +
                               std::to_string(p->limits_.max_nesting * 4));
      }
      return true;
    }
    Parser* p;
    int saved;
  };

  bool CheckDepth(size_t at) {
    if (depth_ > limits_.max_nesting) {
      return Fail(at, "nesting deeper than the limit of " + std::to_string(limits_.max_nesting));
    }
    return true;
  }

  // Parses statements until a block tag whose keyword is in `stops` (consumed up to the
  // keyword; *stop receives it). An empty `stops` parses to the end of the template.
  bool ParseBody(Body* out, const std::vector<std::string_view>& stops, std::string* stop,
                 const Token* opener) {
    while (true) {
      const Token& t = Peek();
      if (t.type == Tok::kEof) {
        if (stops.empty()) return true;
        return Fail(opener->pos, "unclosed '" + opener->text + "' block (expected '{% " +
                                     std::string(stops.back()) + " %}')");
      }
      if (t.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kText;
        s->pos = t.pos;
        s->text = t.text;
        out->push_back(std::move(s));
        Next();
        continue;
      }
      if (t.type == Tok::kVarBegin) {
        Next();
        auto s = std::make_unique<Stmt>();
        s->k = Stmt::K::kOutput;
        s->pos = t.pos;
        if (!ParseExpr(&s->expr)) return false;
        if (Peek().type != Tok::kVarEnd) return Fail(Peek().pos, "expected '}}'" + Found());
        Next();
        out->push_back(std::move(s));
        continue;
      }
      if (t.type != Tok::kBlockBegin) return Fail(t.pos, "unexpected token" + Found());
      const Token& kw = Peek(1);
      if (kw.type != Tok::kName) return Fail(kw.pos, "expected a statement keyword" + Found());
      for (std::string_view s : stops) {
        if (kw.text == s) {
          Next();
          Next();
          *stop = kw.text;
          return true;
        }
      }
      Next();
      Next();
      Depth d(this);
      if (!CheckDepth(kw.pos)) return false;
      if (!ParseStatement(kw, out)) return false;
    }
  }

  bool ParseStatement(const Token& kw, Body* out) {
    auto s = std::make_unique<Stmt>();
    s->pos = kw.pos;
    const std::string& k = kw.text;
    bool ok = false;
    if (k == "if") {
      ok = ParseIf(kw, s.get());
    } else if (k == "for") {
      ok = ParseFor(kw, s.get());
    } else if (k == "set") {
      ok = ParseSet(kw, s.get());
    } else if (k == "macro") {
      ok = ParseMacro(kw, s.get());
    } else if (k == "break" || k == "continue") {
      s->k = k == "break" ? Stmt::K::kBreak : Stmt::K::kContinue;
      ok = ExpectBlockEnd();
    } else if (k == "generation") {  // transformers' assistant-mask marker: renders its body
      s->k = Stmt::K::kBlock;
      ok = ParseBlockBody(kw, "endgeneration", s.get());
    } else if (k == "filter") {
      s->k = Stmt::K::kFilterBlock;
      ok = ParseFilterChain(&s->expr) && ParseBlockBody(kw, "endfilter", s.get());
    } else if (k == "call") {
      ok = ParseCallBlock(kw, s.get());
    } else if (k == "with") {
      ok = ParseWith(kw, s.get());
    } else if (k == "do") {
      s->k = Stmt::K::kDo;
      ok = ParseExpr(&s->expr) && ExpectBlockEnd();
    } else {
      return Fail(kw.pos, "unknown statement '" + k + "'");
    }
    if (!ok) return false;
    out->push_back(std::move(s));
    return true;
  }

  // The end of a block's opening tag, its body and the closing tag `end` (e.g. "endfilter").
  bool ParseBlockBody(const Token& kw, std::string_view end, Stmt* s) {
    std::string stop;
    return ExpectBlockEnd() && ParseBody(&s->body, {end}, &stop, &kw) && ExpectBlockEnd();
  }

  // {% if c %}...{% elif c %}...{% else %}...{% endif %}
  bool ParseIf(const Token& kw, Stmt* s) {
    s->k = Stmt::K::kIf;
    std::string stop;
    ExprPtr cond;
    if (!ParseExpr(&cond) || !ExpectBlockEnd()) return false;
    while (true) {
      Body body;
      if (!ParseBody(&body, {"elif", "else", "endif"}, &stop, &kw)) return false;
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "endif") break;
      if (stop == "elif") {
        if (!ParseExpr(&cond) || !ExpectBlockEnd()) return false;
        continue;
      }
      // else
      if (!ExpectBlockEnd()) return false;
      Body else_body;
      if (!ParseBody(&else_body, {"endif"}, &stop, &kw)) return false;
      s->branches.emplace_back(nullptr, std::move(else_body));
      break;
    }
    return ExpectBlockEnd();
  }

  // {% for a, b in xs if cond recursive %}...{% else %}...{% endfor %}
  bool ParseFor(const Token& kw, Stmt* s) {
    s->k = Stmt::K::kFor;
    std::string stop;
    while (true) {
      std::string v;
      if (!ExpectName(&v)) return false;
      s->vars.push_back(v);
      if (!IsOp(",")) break;
      Next();
    }
    if (!IsName("in")) return Fail(Peek().pos, "expected 'in'" + Found());
    Next();
    if (!ParseOr(&s->expr)) return false;
    if (IsName("if")) {
      Next();
      if (!ParseOr(&s->cond)) return false;
    }
    if (IsName("recursive")) {
      Next();
      s->recursive = true;
    }
    if (!ExpectBlockEnd()) return false;
    if (!ParseBody(&s->body, {"else", "endfor"}, &stop, &kw)) return false;
    if (stop == "else") {
      if (!ExpectBlockEnd()) return false;
      if (!ParseBody(&s->else_body, {"endfor"}, &stop, &kw)) return false;
    }
    return ExpectBlockEnd();
  }

  // {% set x = v %}, {% set ns.attr = v %}, {% set a, b = v %}, {% set t = 1, 2 %} and the
  // block forms {% set x %}...{% endset %}, {% set x | f %}...{% endset %}.
  bool ParseSet(const Token& kw, Stmt* s) {
    std::string target;
    if (!ExpectName(&target)) return false;
    s->vars.push_back(target);
    if (IsOp(".")) {
      Next();
      if (!ExpectName(&s->attr)) return false;
    }
    while (IsOp(",") && s->attr.empty()) {  // {% set a, b = ... %}
      Next();
      std::string v;
      if (!ExpectName(&v)) return false;
      s->vars.push_back(std::move(v));
    }
    if ((Peek().type == Tok::kBlockEnd || IsOp("|")) && s->vars.size() == 1) {
      if (!s->attr.empty()) return Fail(Peek().pos, "expected '='");
      s->k = Stmt::K::kSetBlock;  // {% set x %}...{% endset %}, {% set x | f %}...
      if (IsOp("|") && !ParseFilterChain(&s->expr)) return false;
      return ParseBlockBody(kw, "endset", s);
    }
    s->k = Stmt::K::kSet;
    if (!Expect("=") || !ParseExpr(&s->expr)) return false;
    if (IsOp(",")) {  // a bare tuple: {% set t = 1, 2 %}
      ExprPtr e = Make(Expr::K::kList, s->expr->pos);
      e->args.push_back(std::move(s->expr));
      while (IsOp(",")) {
        Next();
        if (Peek().type == Tok::kBlockEnd) break;
        ExprPtr x;
        if (!ParseExpr(&x)) return false;
        e->args.push_back(std::move(x));
      }
      s->expr = std::move(e);
    }
    return ExpectBlockEnd();
  }

  // {% macro name(params) %}...{% endmacro [name] %}
  bool ParseMacro(const Token& kw, Stmt* s) {
    s->k = Stmt::K::kMacro;
    std::string stop;
    if (!ExpectName(&s->name) || !Expect("(") || !ParseParams(s)) return false;
    if (!ExpectBlockEnd()) return false;
    if (!ParseBody(&s->body, {"endmacro"}, &stop, &kw)) return false;
    if (Peek().type == Tok::kName) Next();  // {% endmacro name %}
    return ExpectBlockEnd();
  }

  // {% call(params) macro(args) %}...{% endcall %}
  bool ParseCallBlock(const Token& kw, Stmt* s) {
    s->k = Stmt::K::kCallBlock;
    if (IsOp("(")) {  // {% call(item) macro() %}: the parameters of caller()
      Next();
      if (!ParseParams(s)) return false;
    }
    const size_t at = Peek().pos;
    if (!ParseExpr(&s->expr)) return false;
    if (s->expr->k != Expr::K::kCall) return Fail(at, "expected a macro call after 'call'");
    return ParseBlockBody(kw, "endcall", s);
  }

  // {% with a = 1, b = 2 %}...{% endwith %}
  bool ParseWith(const Token& kw, Stmt* s) {
    s->k = Stmt::K::kWith;
    while (Peek().type == Tok::kName) {
      std::string v;
      ExprPtr value;
      if (!ExpectName(&v) || !Expect("=") || !ParseExpr(&value)) return false;
      s->vars.push_back(std::move(v));
      s->defaults.push_back(std::move(value));
      if (!IsOp(",")) break;
      Next();
    }
    return ParseBlockBody(kw, "endwith", s);
  }

  // The filters of {% filter f|g(x) %} and {% set x | f %}: a chain over the block's text.
  bool ParseFilterChain(ExprPtr* out) {
    ExprPtr chain = Make(Expr::K::kBlockValue, Peek().pos);
    int filters = 0;
    do {
      if (IsOp("|")) Next();
      if (++filters > limits_.max_nesting) {
        return Fail(Peek().pos,
                    "nesting deeper than the limit of " + std::to_string(limits_.max_nesting));
      }
      ExprPtr e = Make(Expr::K::kFilter, Peek().pos);
      if (!ExpectName(&e->name)) return false;
      e->args.push_back(std::move(chain));
      if (IsOp("(")) {
        Next();
        if (!ParseArgs(e.get())) return false;
      }
      chain = std::move(e);
    } while (IsOp("|"));
    *out = std::move(chain);
    return true;
  }

  // Macro or caller parameters after '(' up to and including ')': names with optional defaults.
  bool ParseParams(Stmt* s) {
    while (!IsOp(")")) {
      std::string p;
      if (!ExpectName(&p)) return false;
      s->params.push_back(p);
      ExprPtr def;
      if (IsOp("=")) {
        Next();
        if (!ParseExpr(&def)) return false;
      }
      s->defaults.push_back(std::move(def));
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  ExprPtr Make(Expr::K k, size_t pos) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->pos = pos;
    return e;
  }

  // expr := or ['if' or ['else' expr]]
  bool ParseExpr(ExprPtr* out) {
    Depth d(this);
    if (!CheckDepth(Peek().pos)) return false;
    ExprPtr value;
    if (!ParseOr(&value)) return false;
    if (!IsName("if")) {
      *out = std::move(value);
      return true;
    }
    const size_t at = Next().pos;
    ExprPtr e = Make(Expr::K::kTernary, at);
    ExprPtr cond, other;
    if (!ParseOr(&cond)) return false;
    if (IsName("else")) {
      Next();
      if (!ParseExpr(&other)) return false;
    }
    e->args.push_back(std::move(cond));
    e->args.push_back(std::move(value));
    e->args.push_back(std::move(other));
    *out = std::move(e);
    return true;
  }

  bool ParseOr(ExprPtr* out) {
    Chain c(this);
    if (!ParseAnd(out)) return false;
    while (IsName("or")) {
      if (!c.Link(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kOr, Next().pos);
      ExprPtr rhs;
      if (!ParseAnd(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
    return true;
  }

  bool ParseAnd(ExprPtr* out) {
    Chain c(this);
    if (!ParseNot(out)) return false;
    while (IsName("and")) {
      if (!c.Link(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kAnd, Next().pos);
      ExprPtr rhs;
      if (!ParseNot(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
    return true;
  }

  bool ParseNot(ExprPtr* out) {
    if (IsName("not")) {
      Depth d(this);
      if (!CheckDepth(Peek().pos)) return false;
      ExprPtr e = Make(Expr::K::kUnary, Next().pos);
      e->name = "not";
      ExprPtr x;
      if (!ParseNot(&x)) return false;
      e->args.push_back(std::move(x));
      *out = std::move(e);
      return true;
    }
    return ParseCompare(out);
  }

  bool ParseCompare(ExprPtr* out) {
    Chain c(this);
    if (!ParseMath1(out)) return false;
    while (true) {
      const Token& t = Peek();
      std::string op;
      if (t.type == Tok::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                 t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        Next();
      } else if (IsName("in")) {
        op = "in";
        Next();
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        Next();
        Next();
      } else {
        return true;
      }
      if (!c.Link(t.pos)) return false;
      ExprPtr e = Make(Expr::K::kBinary, t.pos);
      e->name = op;
      ExprPtr rhs;
      if (!ParseMath1(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
  }

  bool ParseBinaryLevel(ExprPtr* out, std::initializer_list<std::string_view> ops,
                        bool (Parser::*next)(ExprPtr*)) {
    Chain c(this);
    if (!(this->*next)(out)) return false;
    while (true) {
      const Token& t = Peek();
      bool match = false;
      for (std::string_view op : ops) match = match || (t.type == Tok::kOp && t.text == op);
      if (!match) return true;
      if (!c.Link(t.pos)) return false;
      Next();
      ExprPtr e = Make(Expr::K::kBinary, t.pos);
      e->name = t.text;
      ExprPtr rhs;
      if (!(this->*next)(&rhs)) return false;
      e->args.push_back(std::move(*out));
      e->args.push_back(std::move(rhs));
      *out = std::move(e);
    }
  }
  bool ParseMath1(ExprPtr* out) { return ParseBinaryLevel(out, {"+", "-"}, &Parser::ParseConcat); }
  bool ParseConcat(ExprPtr* out) { return ParseBinaryLevel(out, {"~"}, &Parser::ParseMath2); }
  bool ParseMath2(ExprPtr* out) {
    return ParseBinaryLevel(out, {"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  bool ParsePow(ExprPtr* out) { return ParseBinaryLevel(out, {"**"}, &Parser::ParseUnary); }

  bool ParseUnary(ExprPtr* out) {
    Depth d(this);
    if (!CheckDepth(Peek().pos)) return false;
    if (IsOp("-") || IsOp("+")) {
      ExprPtr e = Make(Expr::K::kUnary, Peek().pos);
      e->name = Next().text;
      ExprPtr x;
      if (!ParseUnary(&x)) return false;
      e->args.push_back(std::move(x));
      *out = std::move(e);
      return true;
    }
    if (!ParsePrimary(out) || !ParsePostfix(out)) return false;
    return ParseFilters(out);
  }

  bool ParseArgs(Expr* e) {  // after '(' up to and including ')'
    while (!IsOp(")")) {
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        std::string key = Next().text;
        Next();
        ExprPtr v;
        if (!ParseExpr(&v)) return false;
        e->kwargs.emplace_back(std::move(key), std::move(v));
      } else {
        ExprPtr v;
        if (!ParseExpr(&v)) return false;
        e->args.push_back(std::move(v));
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }

  bool ParsePostfix(ExprPtr* out) {
    Chain c(this);
    while (true) {
      if ((IsOp(".") || IsOp("[") || IsOp("(")) && !c.Link(Peek().pos)) return false;
      if (IsOp(".")) {
        ExprPtr e = Make(Expr::K::kAttr, Next().pos);
        if (Peek().type == Tok::kInt) {  // foo.0
          e->k = Expr::K::kItem;
          ExprPtr idx = Make(Expr::K::kLiteral, Peek().pos);
          idx->lit = Value(Next().i);
          e->args.push_back(std::move(*out));
          e->args.push_back(std::move(idx));
        } else {
          if (!ExpectName(&e->name)) return false;
          e->args.push_back(std::move(*out));
        }
        *out = std::move(e);
      } else if (IsOp("[")) {
        const size_t at = Next().pos;
        ExprPtr parts[3];
        bool slice = false;
        for (int i = 0; i < 3; ++i) {
          if (!IsOp(":") && !IsOp("]")) {
            if (!ParseExpr(&parts[i])) return false;
          }
          if (i < 2 && IsOp(":")) {
            Next();
            slice = true;
          } else {
            break;
          }
        }
        if (!Expect("]")) return false;
        ExprPtr e = Make(slice ? Expr::K::kSlice : Expr::K::kItem, at);
        if (!slice && !parts[0]) return Fail(at, "expected an index");
        e->args.push_back(std::move(*out));
        e->args.push_back(std::move(parts[0]));
        if (slice) {
          e->args.push_back(std::move(parts[1]));
          e->args.push_back(std::move(parts[2]));
        }
        *out = std::move(e);
      } else if (IsOp("(")) {
        ExprPtr e = Make(Expr::K::kCall, Next().pos);
        e->args.push_back(std::move(*out));
        if (!ParseArgs(e.get())) return false;
        *out = std::move(e);
      } else {
        return true;
      }
    }
  }

  bool ParseFilters(ExprPtr* out) {
    Chain c(this);
    while (true) {
      if ((IsOp("|") || IsName("is")) && !c.Link(Peek().pos)) return false;
      if (IsOp("|")) {
        ExprPtr e = Make(Expr::K::kFilter, Next().pos);
        if (!ExpectName(&e->name)) return false;
        e->args.push_back(std::move(*out));
        if (IsOp("(")) {
          Next();
          if (!ParseArgs(e.get())) return false;
        }
        *out = std::move(e);
      } else if (IsName("is")) {
        ExprPtr e = Make(Expr::K::kTest, Next().pos);
        if (IsName("not")) {
          Next();
          e->negated = true;
        }
        // Tests named by keywords: none, true, false, in.
        if (Peek().type != Tok::kName) return Fail(Peek().pos, "expected a test name" + Found());
        e->name = Next().text;
        e->args.push_back(std::move(*out));
        if (IsOp("(")) {
          Next();
          if (!ParseArgs(e.get())) return false;
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt ||
                   Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && !IsName("and") && !IsName("or") && !IsName("if") &&
                    !IsName("else") && !IsName("is") && !IsName("not") && !IsName("in"))) {
          ExprPtr arg;  // `x is divisibleby 3`, `x is sameas none`
          if (!ParsePrimary(&arg)) return false;
          e->args.push_back(std::move(arg));
        }
        *out = std::move(e);
      } else {
        return true;
      }
    }
  }

  bool ParsePrimary(ExprPtr* out) {
    const Token& t = Peek();
    switch (t.type) {
      case Tok::kName: {
        Next();
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        if (t.text == "true" || t.text == "True") {
          e->lit = Value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->lit = Value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->lit = Value::None();
        } else {
          e->k = Expr::K::kName;
          e->name = t.text;
        }
        *out = std::move(e);
        return true;
      }
      case Tok::kString: {
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        std::string s;
        while (Peek().type == Tok::kString) s += Next().text;  // 'a' 'b' is 'ab'
        e->lit = Value(std::move(s));
        *out = std::move(e);
        return true;
      }
      case Tok::kInt:
      case Tok::kFloat: {
        Next();
        ExprPtr e = Make(Expr::K::kLiteral, t.pos);
        e->lit = t.type == Tok::kInt ? Value(t.i) : Value(t.f);
        *out = std::move(e);
        return true;
      }
      case Tok::kOp:
        if (t.text == "(") {
          Next();
          ExprPtr first;
          if (IsOp(")")) {  // the empty tuple
            Next();
            *out = Make(Expr::K::kList, t.pos);
            return true;
          }
          if (!ParseExpr(&first)) return false;
          if (IsOp(",")) {  // a tuple, as a list
            ExprPtr e = Make(Expr::K::kList, t.pos);
            e->args.push_back(std::move(first));
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              ExprPtr v;
              if (!ParseExpr(&v)) return false;
              e->args.push_back(std::move(v));
            }
            first = std::move(e);
          }
          if (!Expect(")")) return false;
          *out = std::move(first);
          return true;
        }
        if (t.text == "[" || t.text == "{") {
          const bool dict = t.text == "{";
          const std::string close = dict ? "}" : "]";
          Next();
          ExprPtr e = Make(dict ? Expr::K::kDict : Expr::K::kList, t.pos);
          while (!IsOp(close)) {
            ExprPtr v;
            if (!ParseExpr(&v)) return false;
            e->args.push_back(std::move(v));
            if (dict) {
              if (!Expect(":")) return false;
              ExprPtr val;
              if (!ParseExpr(&val)) return false;
              e->args.push_back(std::move(val));
            }
            if (!IsOp(",")) break;
            Next();
          }
          if (!Expect(close)) return false;
          *out = std::move(e);
          return true;
        }
        break;
      default:
        break;
    }
    return Fail(t.pos, "expected an expression" + Found());
  }

  const std::vector<Token>& t_;
  const Positions& pos_;
  const Limits& limits_;
  size_t p_ = 0;
  int depth_ = 0;
  int links_ = 0;  // chain links on the current path (Chain)
  Error err_;
};

}  // namespace
}  // namespace internal

Result<Template> Template::Parse(std::string_view source, const Limits& limits) {
  if (source.size() > limits.max_template_bytes) {
    return Error{"template of " + std::to_string(source.size()) +
                 " bytes is over the size limit of " + std::to_string(limits.max_template_bytes)};
  }
  auto impl = std::make_shared<Impl>();
  impl->source = std::string(source);
  impl->limits = limits;
  impl->positions = std::make_unique<internal::Positions>(impl->source);
  Result<std::vector<internal::Token>> toks = internal::Lex(impl->source, *impl->positions);
  if (!toks.ok()) return toks.error();
  internal::Parser parser(*toks, *impl->positions, impl->limits);
  if (!parser.ParseTemplate(&impl->body)) return parser.error();
  return Template(std::move(impl));
}

}  // namespace lamina::chat::jinja
