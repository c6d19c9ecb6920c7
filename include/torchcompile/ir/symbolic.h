// Integer expressions of size symbols (`s0`, `s0*64`, `s0 + 1`, `s0//2`): the sizes of a graph
// traced with dynamic shapes, and the integer arguments computed from them. Our own small type,
// not c10::SymInt (whose API differs between LibTorch 1.13 and 2.x, and which eager kernels
// reject): an expression is a polynomial with integer coefficients over *atoms*, each a symbol
// or the floor division of an expression by a positive constant, kept in one canonical form, so
// that equal expressions print alike and compare equal (`(s0 + 1)*(s0 + 1)` is
// `s0*s0 + 2*s0 + 1`).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torchcompile::ir {

class SymExpr {
 public:
  /// 0.
  SymExpr() = default;
  /// A constant.
  /*implicit*/ SymExpr(int64_t constant);
  /// The symbol `name` (an identifier: `s0`, `u1`).
  static SymExpr symbol(const std::string& name);

  /// Whether it is a constant, and which.
  bool is_constant() const;
  std::optional<int64_t> constant() const;
  /// The symbol's name, if the expression is one symbol.
  std::optional<std::string> as_symbol() const;
  /// The symbols it uses, sorted, each once.
  std::vector<std::string> symbols() const;

  /// Its value when each symbol has the value `value(name)` gives.
  int64_t evaluate(const std::function<int64_t(const std::string&)>& value) const;
  /// Its value for these symbol values; throws naming a symbol that has none.
  int64_t evaluate(const std::map<std::string, int64_t>& values) const;

  /// Python's spelling, as sympy prints it: `2*s0 + 1`, `s0*s1`, `s0//2`, `(s0 + 1)//2`, `-s0 + 3`.
  const std::string& str() const { return str_; }
  /// Reads str()'s form back (also accepts spaces anywhere and parentheses around any part);
  /// throws a c10::Error naming the position of a syntax error.
  static SymExpr parse(const std::string& text);

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a);
  /// `a // divisor` rounded towards negative infinity (Python's `//`); `divisor` > 0.
  friend SymExpr floordiv(const SymExpr& a, int64_t divisor);

  bool operator==(const SymExpr& o) const { return str_ == o.str_; }
  bool operator!=(const SymExpr& o) const { return !(*this == o); }

 private:
  // An atom: a symbol, or `numerator // divisor`.
  struct Atom {
    std::string symbol;
    std::shared_ptr<const SymExpr> numerator;
    int64_t divisor = 0;
    std::string key;  // its printed form: orders atoms and identifies them
  };
  // A term: coefficient * the product of its atoms (sorted by key; repeated for powers).
  struct Term {
    std::vector<Atom> atoms;
    int64_t coefficient = 0;
  };
  static std::string monomial_key(const std::vector<Atom>& atoms);
  void add_term(Term t);
  void finish();  // recompute str_

  std::map<std::string, Term> terms_;  // by monomial key; "" is the constant term
  std::string str_ = "0";
};

}  // namespace torchcompile::ir
