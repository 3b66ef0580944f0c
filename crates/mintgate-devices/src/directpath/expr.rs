//! Arithmetic expressions over the input value `x`, for the `expr(...)`
//! filter: numbers, `x`, `+ - * / % ^`, comparisons (`< <= > >= == !=`,
//! giving 1 or 0), `&& || !`, parentheses and the functions `abs`, `sqrt`,
//! `floor`, `ceil`, `round`, `min`, `max`, `clamp(v, lo, hi)`.
//!
//! Precedence, loosest first: `||`, `&&`, comparisons, `+ -`, `* / %`,
//! unary `- !`, `^` (right-associative, so `-2^2` is -4 and `2^-1` is 0.5).
//!
//! An expression is parsed once into an [`Expr`] tree and compiled to a
//! [`Program`] in postfix order that evaluates on a fixed stack, with no
//! allocation per event.

use std::fmt;

use crate::parse::fmt_number;

/// Most nesting the parser accepts, and most stack a program may use.
pub const MAX_DEPTH: usize = 48;

/// Deepest tree [`parse`] accepts. The fully parenthesized [`Display`]
/// form costs the parser up to three levels of [`MAX_DEPTH`] per tree
/// level (`(-e)`: the group, the operator, the operand) plus one, so any
/// tree this deep prints to text that parses back.
///
/// [`Display`]: fmt::Display
pub const MAX_TREE_DEPTH: usize = (MAX_DEPTH - 1) / 3;

/// Binary operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%` (remainder with the sign of the dividend)
    Rem,
    /// `^`
    Pow,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `&&`
    And,
    /// `||`
    Or,
}

impl BinOp {
    fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            Pow => "^",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            Eq => "==",
            Ne => "!=",
            And => "&&",
            Or => "||",
        }
    }

    /// Applies the operator.
    pub fn apply(self, a: f64, b: f64) -> f64 {
        use BinOp::*;
        let t = |c: bool| if c { 1.0 } else { 0.0 };
        match self {
            Add => a + b,
            Sub => a - b,
            Mul => a * b,
            Div => a / b,
            Rem => a % b,
            Pow => a.powf(b),
            Lt => t(a < b),
            Le => t(a <= b),
            Gt => t(a > b),
            Ge => t(a >= b),
            Eq => t(a == b),
            Ne => t(a != b),
            And => t(a != 0.0 && b != 0.0),
            Or => t(a != 0.0 || b != 0.0),
        }
    }
}

/// Functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Func {
    /// `abs(v)`
    Abs,
    /// `sqrt(v)`
    Sqrt,
    /// `floor(v)`
    Floor,
    /// `ceil(v)`
    Ceil,
    /// `round(v)`
    Round,
    /// `min(a, b)`
    Min,
    /// `max(a, b)`
    Max,
    /// `clamp(v, lo, hi)` (NaN when lo > hi)
    Clamp,
}

impl Func {
    const ALL: [(Func, &'static str, usize); 8] = [
        (Func::Abs, "abs", 1),
        (Func::Sqrt, "sqrt", 1),
        (Func::Floor, "floor", 1),
        (Func::Ceil, "ceil", 1),
        (Func::Round, "round", 1),
        (Func::Min, "min", 2),
        (Func::Max, "max", 2),
        (Func::Clamp, "clamp", 3),
    ];

    fn name(self) -> &'static str {
        Func::ALL.iter().find(|f| f.0 == self).map_or("?", |f| f.1)
    }

    /// How many arguments it takes.
    pub fn arity(self) -> usize {
        Func::ALL.iter().find(|f| f.0 == self).map_or(0, |f| f.2)
    }

    fn apply(self, a: &[f64]) -> f64 {
        match self {
            Func::Abs => a[0].abs(),
            Func::Sqrt => a[0].sqrt(),
            Func::Floor => a[0].floor(),
            Func::Ceil => a[0].ceil(),
            Func::Round => a[0].round(),
            Func::Min => a[0].min(a[1]),
            Func::Max => a[0].max(a[1]),
            Func::Clamp => {
                if a[1] > a[2] || a[1].is_nan() || a[2].is_nan() {
                    f64::NAN
                } else {
                    a[0].clamp(a[1], a[2])
                }
            }
        }
    }
}

/// An expression tree.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A literal.
    Num(f64),
    /// The input value.
    X,
    /// `-e`
    Neg(Box<Expr>),
    /// `!e` (1 when e is 0, else 0)
    Not(Box<Expr>),
    /// `a op b`
    Bin(BinOp, Box<Expr>, Box<Expr>),
    /// `f(args)`
    Call(Func, Vec<Expr>),
}

impl fmt::Display for Expr {
    /// Fully parenthesized, so that parsing it back gives the same tree.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expr::Num(v) if v.is_sign_negative() => write!(f, "(-{})", fmt_number(-v)),
            Expr::Num(v) => write!(f, "{}", fmt_number(*v)),
            Expr::X => write!(f, "x"),
            Expr::Neg(e) => write!(f, "(-{e})"),
            Expr::Not(e) => write!(f, "(!{e})"),
            Expr::Bin(op, a, b) => write!(f, "({a} {} {b})", op.symbol()),
            Expr::Call(func, args) => {
                write!(f, "{}(", func.name())?;
                for (i, a) in args.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{a}")?;
                }
                write!(f, ")")
            }
        }
    }
}

impl Expr {
    /// Levels of the tree (1 for a number or `x`).
    fn height(&self) -> usize {
        match self {
            Expr::Num(_) | Expr::X => 1,
            Expr::Neg(e) | Expr::Not(e) => 1 + e.height(),
            Expr::Bin(_, a, b) => 1 + a.height().max(b.height()),
            Expr::Call(_, args) => 1 + args.iter().map(Expr::height).max().unwrap_or(0),
        }
    }

    /// Evaluates the tree directly (the reference the compiled program is
    /// checked against).
    pub fn eval(&self, x: f64) -> f64 {
        match self {
            Expr::Num(v) => *v,
            Expr::X => x,
            Expr::Neg(e) => -e.eval(x),
            Expr::Not(e) => {
                if e.eval(x) == 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
            Expr::Bin(op, a, b) => op.apply(a.eval(x), b.eval(x)),
            Expr::Call(func, args) => {
                let v: Vec<f64> = args.iter().map(|a| a.eval(x)).collect();
                func.apply(&v)
            }
        }
    }

    /// Compiles to a postfix program; fails when it needs more than
    /// [`MAX_DEPTH`] stack slots.
    pub fn compile(&self) -> Result<Program, String> {
        let mut ops = Vec::new();
        let mut depth = 0;
        let mut max = 0;
        self.emit(&mut ops, &mut depth, &mut max);
        if max > MAX_DEPTH {
            return Err(format!(
                "expression too complex (needs {max} stack slots, at most {MAX_DEPTH})"
            ));
        }
        Ok(Program { ops })
    }

    fn emit(&self, ops: &mut Vec<Op>, depth: &mut usize, max: &mut usize) {
        let mut push = |ops: &mut Vec<Op>, op: Op, d: &mut usize, delta: isize| {
            ops.push(op);
            *d = (*d as isize + delta) as usize;
            *max = (*max).max(*d);
        };
        match self {
            Expr::Num(v) => push(ops, Op::Num(*v), depth, 1),
            Expr::X => push(ops, Op::X, depth, 1),
            Expr::Neg(e) => {
                e.emit(ops, depth, max);
                ops.push(Op::Neg);
            }
            Expr::Not(e) => {
                e.emit(ops, depth, max);
                ops.push(Op::Not);
            }
            Expr::Bin(op, a, b) => {
                a.emit(ops, depth, max);
                b.emit(ops, depth, max);
                ops.push(Op::Bin(*op));
                *depth -= 1;
            }
            Expr::Call(func, args) => {
                for a in args {
                    a.emit(ops, depth, max);
                }
                ops.push(Op::Call(*func));
                *depth -= args.len().saturating_sub(1);
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Num(f64),
    X,
    Neg,
    Not,
    Bin(BinOp),
    Call(Func),
}

/// A compiled expression.
///
/// Invariant: `ops` is a well-formed postfix sequence (every operator finds
/// its operands, one value remains) whose stack never exceeds
/// [`MAX_DEPTH`]; [`Expr::compile`] is the only constructor.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    ops: Vec<Op>,
}

impl Program {
    /// Evaluates with the input `x`, without allocating.
    pub fn eval(&self, x: f64) -> f64 {
        let mut st = [0f64; MAX_DEPTH];
        let mut n = 0usize;
        for op in &self.ops {
            match *op {
                Op::Num(v) => {
                    st[n] = v;
                    n += 1;
                }
                Op::X => {
                    st[n] = x;
                    n += 1;
                }
                Op::Neg => st[n - 1] = -st[n - 1],
                Op::Not => st[n - 1] = if st[n - 1] == 0.0 { 1.0 } else { 0.0 },
                Op::Bin(b) => {
                    st[n - 2] = b.apply(st[n - 2], st[n - 1]);
                    n -= 1;
                }
                Op::Call(f) => {
                    let k = f.arity();
                    let v = f.apply(&st[n - k..n]);
                    n -= k;
                    st[n] = v;
                    n += 1;
                }
            }
        }
        st[0]
    }
}

/// Parses an expression.
pub fn parse(s: &str) -> Result<Expr, String> {
    let mut p = Parser {
        s: s.as_bytes(),
        i: 0,
        depth: 0,
    };
    let e = p.or()?;
    p.ws();
    if p.i == p.s.len() && e.height() > MAX_TREE_DEPTH {
        return Err(format!(
            "expression nested deeper than {MAX_TREE_DEPTH} levels"
        ));
    }
    if p.i != p.s.len() {
        return Err(format!(
            "unexpected `{}` at {} in `{s}`",
            String::from_utf8_lossy(&p.s[p.i..])
                .chars()
                .take(10)
                .collect::<String>(),
            p.i
        ));
    }
    Ok(e)
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
    depth: usize,
}

impl Parser<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }

    fn eat(&mut self, tok: &str) -> bool {
        self.ws();
        if self.s[self.i..].starts_with(tok.as_bytes()) {
            self.i += tok.len();
            true
        } else {
            false
        }
    }

    fn deeper(&mut self) -> Result<(), String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(format!("expression nested deeper than {MAX_DEPTH}"))
        } else {
            Ok(())
        }
    }

    fn binary(
        &mut self,
        ops: &[(&str, BinOp)],
        next: fn(&mut Self) -> Result<Expr, String>,
    ) -> Result<Expr, String> {
        let mut a = next(self)?;
        'outer: loop {
            for (tok, op) in ops {
                // `<` must not take the first byte of `<=`, nor `!` of `!=` etc.
                if self.peek_op(tok) {
                    self.i += tok.len();
                    let b = next(self)?;
                    a = Expr::Bin(*op, Box::new(a), Box::new(b));
                    continue 'outer;
                }
            }
            return Ok(a);
        }
    }

    fn peek_op(&mut self, tok: &str) -> bool {
        self.ws();
        let rest = &self.s[self.i..];
        if !rest.starts_with(tok.as_bytes()) {
            return false;
        }
        let after = rest.get(tok.len()).copied();
        match tok {
            "<" | ">" | "=" | "!" => after != Some(b'='),
            "&" | "|" => false,
            _ => true,
        }
    }

    fn or(&mut self) -> Result<Expr, String> {
        self.binary(&[("||", BinOp::Or)], Self::and)
    }

    fn and(&mut self) -> Result<Expr, String> {
        self.binary(&[("&&", BinOp::And)], Self::cmp)
    }

    fn cmp(&mut self) -> Result<Expr, String> {
        self.binary(
            &[
                ("<=", BinOp::Le),
                (">=", BinOp::Ge),
                ("==", BinOp::Eq),
                ("!=", BinOp::Ne),
                ("<", BinOp::Lt),
                (">", BinOp::Gt),
            ],
            Self::sum,
        )
    }

    fn sum(&mut self) -> Result<Expr, String> {
        self.binary(&[("+", BinOp::Add), ("-", BinOp::Sub)], Self::prod)
    }

    fn prod(&mut self) -> Result<Expr, String> {
        self.binary(
            &[("*", BinOp::Mul), ("/", BinOp::Div), ("%", BinOp::Rem)],
            Self::unary,
        )
    }

    fn unary(&mut self) -> Result<Expr, String> {
        self.deeper()?;
        let r = if self.eat("-") {
            self.unary().map(|e| Expr::Neg(Box::new(e)))
        } else if self.peek_op("!") {
            self.i += 1;
            self.unary().map(|e| Expr::Not(Box::new(e)))
        } else {
            self.power()
        };
        self.depth -= 1;
        r
    }

    fn power(&mut self) -> Result<Expr, String> {
        let base = self.atom()?;
        if self.eat("^") {
            let exp = self.unary()?;
            return Ok(Expr::Bin(BinOp::Pow, Box::new(base), Box::new(exp)));
        }
        Ok(base)
    }

    fn atom(&mut self) -> Result<Expr, String> {
        self.ws();
        let Some(&c) = self.s.get(self.i) else {
            return Err("expression ends too early".into());
        };
        if c == b'(' {
            self.i += 1;
            self.deeper()?;
            let e = self.or()?;
            self.depth -= 1;
            if !self.eat(")") {
                return Err(format!("missing `)` at {}", self.i));
            }
            return Ok(e);
        }
        if c.is_ascii_digit() || c == b'.' {
            let start = self.i;
            while self
                .s
                .get(self.i)
                .is_some_and(|c| c.is_ascii_digit() || *c == b'.')
            {
                self.i += 1;
            }
            if self.s.get(self.i).is_some_and(|c| *c == b'e' || *c == b'E') {
                let save = self.i;
                self.i += 1;
                if self.s.get(self.i).is_some_and(|c| *c == b'+' || *c == b'-') {
                    self.i += 1;
                }
                if self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                    while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                        self.i += 1;
                    }
                } else {
                    self.i = save;
                }
            }
            let text = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
            return match text.parse::<f64>() {
                Ok(v) if v.is_finite() => Ok(Expr::Num(v)),
                _ => Err(format!("`{text}` is not a finite number")),
            };
        }
        if c.is_ascii_alphabetic() {
            let start = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_alphanumeric) {
                self.i += 1;
            }
            let name = std::str::from_utf8(&self.s[start..self.i]).unwrap_or("");
            if name == "x" {
                return Ok(Expr::X);
            }
            let Some(&(func, _, arity)) = Func::ALL.iter().find(|f| f.1 == name) else {
                return Err(format!(
                    "unknown name `{name}` (the input is `x`; functions: abs, sqrt, floor, ceil, round, min, max, clamp)"
                ));
            };
            if !self.eat("(") {
                return Err(format!("`{name}` needs `(`"));
            }
            self.deeper()?;
            let mut args = Vec::new();
            if !self.eat(")") {
                loop {
                    args.push(self.or()?);
                    if self.eat(")") {
                        break;
                    }
                    if !self.eat(",") {
                        return Err(format!("expected `,` or `)` in the arguments of `{name}`"));
                    }
                }
            }
            self.depth -= 1;
            if args.len() != arity {
                return Err(format!(
                    "`{name}` takes {arity} argument{}, got {}",
                    if arity == 1 { "" } else { "s" },
                    args.len()
                ));
            }
            return Ok(Expr::Call(func, args));
        }
        Err(format!("unexpected `{}` at {}", c as char, self.i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ev(s: &str, x: f64) -> f64 {
        let e = parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        let p = e.compile().unwrap();
        let (a, b) = (e.eval(x), p.eval(x));
        assert!(
            a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
            "{s}"
        );
        a
    }

    #[test]
    fn precedence_and_functions() {
        assert_eq!(ev("x * 1.8 + 32", 100.0), 212.0);
        assert_eq!(ev("1 + 2 * 3 ^ 2", 0.0), 19.0);
        assert_eq!(ev("-2^2", 0.0), -4.0);
        assert_eq!(ev("2^-1", 0.0), 0.5);
        assert_eq!(ev("2^3^2", 0.0), 512.0);
        assert_eq!(ev("10 - 4 - 3", 0.0), 3.0);
        assert_eq!(ev("x > 25 && x <= 30", 26.0), 1.0);
        assert_eq!(ev("x > 25 && x <= 30", 31.0), 0.0);
        assert_eq!(ev("!(x == 0) || 0", 0.0), 0.0);
        assert_eq!(ev("x != 1", 0.0), 1.0);
        assert_eq!(ev("clamp(x, 0, 10) + max(1, 2) - min(1, 2)", 50.0), 11.0);
        assert_eq!(
            ev(
                "abs(-3) + sqrt(16) + floor(1.5) + ceil(1.5) + round(2.5)",
                0.0
            ),
            13.0
        );
        assert_eq!(ev("7 % 4", 0.0), 3.0);
        assert_eq!(ev("1e3 + 2.5E-1", 0.0), 1000.25);
        assert!(ev("sqrt(x)", -1.0).is_nan());
    }

    /// Found by the device_links fuzz target: 16 unary minus signs parsed,
    /// but the parenthesized form they print as was refused as too deep.
    #[test]
    fn whatever_parses_prints_to_text_that_parses_back() {
        let deep = format!("{}4", "-".repeat(MAX_TREE_DEPTH - 1));
        let e = parse(&deep).unwrap();
        assert_eq!(parse(&e.to_string()).unwrap(), e);
        let e = parse(&format!("{}x", "-".repeat(MAX_TREE_DEPTH - 1))).unwrap();
        assert_eq!(parse(&e.to_string()).unwrap(), e);
        let e = parse(&format!("{}x", "!".repeat(MAX_TREE_DEPTH - 1))).unwrap();
        assert_eq!(parse(&e.to_string()).unwrap(), e);
        let err = parse(&format!("{}x", "-".repeat(MAX_TREE_DEPTH))).unwrap_err();
        assert!(err.contains("deeper"), "{err}");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        for (s, why) in [
            ("", "ends too early"),
            ("x +", "ends too early"),
            ("(x", "missing `)`"),
            ("y", "unknown name `y`"),
            ("max(1)", "takes 2 arguments"),
            ("x x", "unexpected"),
            ("1..2", "not a finite number"),
            ("x = 1", "unexpected"),
            ("x & 1", "unexpected"),
            ("#", "unexpected `#`"),
        ] {
            let e = parse(s).unwrap_err();
            assert!(e.contains(why), "{s}: {e}");
        }
        let deep = "(".repeat(60) + "x" + &")".repeat(60);
        assert!(parse(&deep).unwrap_err().contains("deeper"));
    }

    fn expr() -> impl Strategy<Value = Expr> {
        let leaf = prop_oneof![
            (0.0..1e6f64).prop_map(Expr::Num),
            (0u32..100).prop_map(|v| Expr::Num(v as f64)),
            Just(Expr::X),
        ];
        leaf.prop_recursive(6, 40, 3, |inner| {
            let ops = [
                BinOp::Add,
                BinOp::Sub,
                BinOp::Mul,
                BinOp::Div,
                BinOp::Rem,
                BinOp::Pow,
                BinOp::Lt,
                BinOp::Le,
                BinOp::Gt,
                BinOp::Ge,
                BinOp::Eq,
                BinOp::Ne,
                BinOp::And,
                BinOp::Or,
            ];
            prop_oneof![
                inner.clone().prop_map(|e| Expr::Neg(Box::new(e))),
                inner.clone().prop_map(|e| Expr::Not(Box::new(e))),
                (0..ops.len(), inner.clone(), inner.clone()).prop_map(move |(i, a, b)| Expr::Bin(
                    ops[i],
                    Box::new(a),
                    Box::new(b)
                )),
                (0..Func::ALL.len(), proptest::collection::vec(inner, 3)).prop_map(|(i, mut v)| {
                    let (f, _, k) = Func::ALL[i];
                    v.truncate(k);
                    Expr::Call(f, v)
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn display_parses_back_to_the_same_tree(e in expr()) {
            let text = e.to_string();
            prop_assert_eq!(parse(&text), Ok(e), "{}", text);
        }

        #[test]
        fn compiled_program_matches_the_tree(e in expr(), x in -1e3f64..1e3) {
            let p = e.compile().unwrap();
            let (a, b) = (e.eval(x), p.eval(x));
            prop_assert!(a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()), "{} at {}: {} vs {}", e, x, a, b);
        }

        #[test]
        fn parser_never_panics(s in "[-+*/%^<>=!&|() ,.0-9xa-z]{0,40}") {
            if let Ok(e) = parse(&s) {
                let _ = e.compile().map(|p| p.eval(1.0));
            }
        }
    }
}
