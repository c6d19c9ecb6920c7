// Integer expressions of size symbols (ir/symbolic.h).
#include <torchcompile/ir/symbolic.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <set>

namespace torchcompile::ir {

namespace {

// Python's `//` on integers.
int64_t floor_div(int64_t n, int64_t d) {
  int64_t q = n / d;
  if (n % d != 0 && ((n < 0) != (d < 0))) --q;
  return q;
}

}  // namespace

SymExpr::SymExpr(int64_t constant) {
  if (constant != 0) terms_[""] = Term{{}, constant};
  finish();
}

SymExpr SymExpr::symbol(const std::string& name) {
  TORCH_CHECK(!name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_'),
              "SymExpr::symbol: expected an identifier, got '", name, "'");
  for (char c : name)
    TORCH_CHECK(std::isalnum(static_cast<unsigned char>(c)) || c == '_', "SymExpr::symbol: expected an identifier, got '",
                name, "'");
  SymExpr e;
  Atom a;
  a.symbol = name;
  a.key = name;
  e.add_term(Term{{a}, 1});
  e.finish();
  return e;
}

std::string SymExpr::monomial_key(const std::vector<Atom>& atoms) {
  std::string key;
  for (size_t i = 0; i < atoms.size(); ++i) key += (i ? "*" : "") + atoms[i].key;
  return key;
}

void SymExpr::add_term(Term t) {
  if (t.coefficient == 0) return;
  // Symbols first, then floor divisions, each by key: `s1*(s0//2)`.
  std::sort(t.atoms.begin(), t.atoms.end(), [](const Atom& a, const Atom& b) {
    return std::make_pair(a.divisor != 0, a.key) < std::make_pair(b.divisor != 0, b.key);
  });
  const std::string key = monomial_key(t.atoms);
  auto it = terms_.find(key);
  if (it == terms_.end()) {
    terms_.emplace(key, std::move(t));
    return;
  }
  it->second.coefficient += t.coefficient;
  if (it->second.coefficient == 0) terms_.erase(it);
}

void SymExpr::finish() {
  // Higher degree first, then by key; the constant last.
  std::vector<const Term*> order;
  for (const auto& [key, t] : terms_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const Term* a, const Term* b) { return a->atoms.size() > b->atoms.size(); });
  std::string s;
  for (const Term* t : order) {
    const bool negative = t->coefficient < 0;
    const int64_t magnitude = negative ? -t->coefficient : t->coefficient;
    std::string body;
    if (t->atoms.empty()) {
      body = std::to_string(magnitude);
    } else {
      const bool alone = t->atoms.size() == 1 && magnitude == 1;
      if (magnitude != 1) body = std::to_string(magnitude);
      for (const Atom& a : t->atoms) {
        if (!body.empty()) body += "*";
        // A floor division inside a product is parenthesized: `s1*(s0//2)`, not `(s1*s0)//2`.
        body += (a.divisor != 0 && !alone) ? "(" + a.key + ")" : a.key;
      }
    }
    if (s.empty()) {
      // `-s0//2` would read back as `(-s0)//2`.
      if (negative && t->atoms.size() == 1 && t->atoms[0].divisor != 0 && magnitude == 1) body = "(" + body + ")";
      s = negative ? "-" + body : body;
    } else {
      s += negative ? " - " + body : " + " + body;
    }
  }
  str_ = s.empty() ? "0" : s;
}

bool SymExpr::is_constant() const { return terms_.empty() || (terms_.size() == 1 && terms_.count("") == 1); }

std::optional<int64_t> SymExpr::constant() const {
  if (!is_constant()) return std::nullopt;
  return terms_.empty() ? 0 : terms_.at("").coefficient;
}

std::optional<std::string> SymExpr::as_symbol() const {
  if (terms_.size() != 1) return std::nullopt;
  const Term& t = terms_.begin()->second;
  if (t.coefficient != 1 || t.atoms.size() != 1 || t.atoms[0].divisor != 0) return std::nullopt;
  return t.atoms[0].symbol;
}

std::vector<std::string> SymExpr::symbols() const {
  std::set<std::string> out;
  for (const auto& [key, t] : terms_) {
    for (const Atom& a : t.atoms) {
      if (a.divisor == 0) {
        out.insert(a.symbol);
      } else {
        for (const std::string& s : a.numerator->symbols()) out.insert(s);
      }
    }
  }
  return {out.begin(), out.end()};
}

int64_t SymExpr::evaluate(const std::function<int64_t(const std::string&)>& value) const {
  int64_t sum = 0;
  for (const auto& [key, t] : terms_) {
    int64_t product = t.coefficient;
    for (const Atom& a : t.atoms)
      product *= a.divisor == 0 ? value(a.symbol) : floor_div(a.numerator->evaluate(value), a.divisor);
    sum += product;
  }
  return sum;
}

int64_t SymExpr::evaluate(const std::map<std::string, int64_t>& values) const {
  return evaluate([&](const std::string& name) {
    auto it = values.find(name);
    TORCH_CHECK(it != values.end(), "SymExpr: no value for symbol ", name, " in ", str_);
    return it->second;
  });
}

SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  SymExpr out = a;
  for (const auto& [key, t] : b.terms_) out.add_term(t);
  out.finish();
  return out;
}

SymExpr operator-(const SymExpr& a) {
  SymExpr out;
  for (const auto& [key, t] : a.terms_) out.add_term(SymExpr::Term{t.atoms, -t.coefficient});
  out.finish();
  return out;
}

SymExpr operator-(const SymExpr& a, const SymExpr& b) { return a + (-b); }

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  SymExpr out;
  for (const auto& [ka, ta] : a.terms_) {
    for (const auto& [kb, tb] : b.terms_) {
      SymExpr::Term t;
      t.atoms = ta.atoms;
      t.atoms.insert(t.atoms.end(), tb.atoms.begin(), tb.atoms.end());
      t.coefficient = ta.coefficient * tb.coefficient;
      out.add_term(std::move(t));
    }
  }
  out.finish();
  return out;
}

SymExpr floordiv(const SymExpr& a, int64_t divisor) {
  TORCH_CHECK(divisor > 0, "SymExpr: floor division by ", divisor, " (expected a positive constant)");
  if (divisor == 1) return a;
  // a = divisor * m + r, where m collects the terms whose coefficients divisor divides:
  // a // divisor = m + r // divisor.
  SymExpr m, r;
  for (const auto& [key, t] : a.terms_) {
    if (t.coefficient % divisor == 0) {
      m.add_term(SymExpr::Term{t.atoms, t.coefficient / divisor});
    } else {
      r.add_term(t);
    }
  }
  m.finish();
  r.finish();
  if (r.is_constant()) return m + SymExpr(floor_div(*r.constant(), divisor));
  SymExpr::Atom atom;
  atom.numerator = std::make_shared<const SymExpr>(r);
  atom.divisor = divisor;
  const bool bare = r.terms_.size() == 1 && r.terms_.begin()->second.coefficient == 1 &&
                    r.terms_.begin()->second.atoms.size() == 1 && r.terms_.begin()->second.atoms[0].divisor == 0;
  atom.key = (bare ? r.str() : "(" + r.str() + ")") + "//" + std::to_string(divisor);
  SymExpr q;
  q.add_term(SymExpr::Term{{atom}, 1});
  q.finish();
  return m + q;
}

// ---- parsing ------------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(const std::string& text) : s_(text) {}

  SymExpr parse() {
    SymExpr e = sum();
    skip();
    if (pos_ != s_.size()) fail("unexpected '" + std::string(1, s_[pos_]) + "'");
    return e;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    TORCH_CHECK(false, "SymExpr::parse: ", what, " at position ", pos_, " of '", s_, "'");
  }
  void skip() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool eat(const char* tok) {
    skip();
    const size_t n = std::char_traits<char>::length(tok);
    if (s_.compare(pos_, n, tok) != 0) return false;
    // `/` alone is not an operator: only `//`.
    pos_ += n;
    return true;
  }
  SymExpr sum() {
    SymExpr e = product();
    while (true) {
      if (eat("+")) {
        e = e + product();
      } else if (eat("-")) {
        e = e - product();
      } else {
        return e;
      }
    }
  }
  SymExpr product() {
    SymExpr e = unary();
    while (true) {
      if (eat("//")) {
        const size_t at = pos_;
        SymExpr d = unary();
        if (!d.is_constant() || *d.constant() <= 0) {
          pos_ = at;
          fail("expected a positive constant divisor");
        }
        e = floordiv(e, *d.constant());
      } else if (eat("*")) {
        e = e * unary();
      } else {
        return e;
      }
    }
  }
  SymExpr unary() {
    if (eat("-")) return -unary();
    return primary();
  }
  SymExpr primary() {
    skip();
    if (pos_ >= s_.size()) fail("unexpected end");
    if (eat("(")) {
      SymExpr e = sum();
      if (!eat(")")) fail("expected ')'");
      return e;
    }
    const char c = s_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c))) {
      int64_t v = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) v = v * 10 + (s_[pos_++] - '0');
      return SymExpr(v);
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t start = pos_;
      while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) || s_[pos_] == '_')) ++pos_;
      return SymExpr::symbol(s_.substr(start, pos_ - start));
    }
    fail("unexpected '" + std::string(1, c) + "'");
  }

  const std::string& s_;
  size_t pos_ = 0;
};

}  // namespace

SymExpr SymExpr::parse(const std::string& text) { return Parser(text).parse(); }

}  // namespace torchcompile::ir
