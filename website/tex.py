"""The little TeX the notebooks' markdown uses ($x_r$, $$\\frac{\\partial L}{\\partial x_s}$$), as
HTML, at build time: the site loads no MathJax (it would come from a CDN, and the site must work
offline). Knows symbols, sub- and superscripts, \\frac, \\text and \\sqrt; anything else is a
`TexError` naming the command, so a notebook that starts using more TeX fails the build with the
fix (add the command here) instead of showing raw TeX.
"""

from __future__ import annotations

from html import escape

SYMBOLS = {
    "cdot": "·", "times": "×", "dots": "…", "ldots": "…", "cdots": "⋯", "pm": "±",
    "approx": "≈", "partial": "∂", "sum": "∑", "prod": "∏", "le": "≤", "leq": "≤", "ge": "≥",
    "geq": "≥", "ne": "≠", "neq": "≠", "to": "→", "rightarrow": "→", "leftarrow": "←",
    "infty": "∞", "in": "∈", "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊", "rfloor": "⌋",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "eta": "η",
    "theta": "θ", "lambda": "λ", "mu": "μ", "pi": "π", "rho": "ρ", "sigma": "σ", "tau": "τ",
    "phi": "φ", "psi": "ψ", "omega": "ω", "Delta": "Δ", "Sigma": "Σ", "Psi": "Ψ",
    "Omega": "Ω", "{": "{", "}": "}", "%": "%", "_": "_", "$": "$",
}
FUNCTIONS = {"cos", "sin", "tan", "exp", "log", "ln", "max", "min", "lim"}
SPACES = {",": "\u2009", ";": "\u2005", ":": "\u2005", "!": "", " ": " ", "quad": "\u2003",
          "qquad": "\u2003\u2003"}
SIZES = {"big", "Big", "bigg", "Bigg", "left", "right"}  # sized delimiters: the delimiter alone


class TexError(ValueError):
    """TeX this module cannot turn into HTML."""


def tex_to_html(tex: str, display: bool = False) -> str:
    """``tex`` (the inside of $...$ or $$...$$) as HTML: a ``<span class="math">`` (a
    ``<div class="math display">`` with ``display``). Raises TexError on a command it does not
    know, naming it and what to do."""
    body = _Parser(tex).parse()
    if display:
        return f'<div class="math display">{body}</div>'
    return f'<span class="math">{body}</span>'


class _Parser:
    def __init__(self, tex: str):
        self.tex, self.i = tex, 0

    def parse(self, until: str | None = None) -> str:
        out = []
        while self.i < len(self.tex):
            c = self.tex[self.i]
            if c == until:
                self.i += 1
                return "".join(out)
            out.append(self.atom())
        if until is not None:
            raise TexError(f"unbalanced braces in TeX {self.tex!r}")
        return "".join(out)

    def group(self) -> str:
        """One argument: {...} or a single token."""
        self.skip_spaces()
        if self.i < len(self.tex) and self.tex[self.i] == "{":
            self.i += 1
            return self.parse(until="}")
        return self.atom()

    def raw_group(self) -> str:
        self.skip_spaces()
        if self.tex[self.i] != "{":
            raise TexError(f"expected {{...}} after a command in TeX {self.tex!r}")
        end = self.tex.index("}", self.i)
        text, self.i = self.tex[self.i + 1:end], end + 1
        return text

    def skip_spaces(self) -> None:
        while self.i < len(self.tex) and self.tex[self.i] == " ":
            self.i += 1

    def atom(self) -> str:
        tex, c = self.tex, self.tex[self.i]
        self.i += 1
        if c == "{":
            return self.parse(until="}")
        if c == "_":
            return f"<sub>{self.group()}</sub>"
        if c == "^":
            return f"<sup>{self.group()}</sup>"
        if c.isalpha():
            return f"<i>{c}</i>"
        if c == "\n":
            return " "
        if c == "-":
            return "−"  # a minus sign, not a hyphen
        if c != "\\":
            return escape(c)
        start = self.i
        while self.i < len(tex) and tex[self.i].isalpha():
            self.i += 1
        name = tex[start:self.i] or tex[self.i:self.i + 1]
        if not tex[start:self.i]:
            self.i += 1
        if name in SYMBOLS:
            return escape(SYMBOLS[name])
        if name in SPACES:
            return SPACES[name]
        if name in FUNCTIONS:
            return f'<span class="fn">{name}</span>\u2009'
        if name in SIZES:
            return ""
        if name == "text" or name == "mathrm":
            return f'<span class="text">{escape(self.raw_group())}</span>'
        if name == "frac":
            top, bottom = self.group(), self.group()
            return (f'<span class="frac"><span class="num">{top}</span>'
                    f'<span class="den">{bottom}</span></span>')
        if name == "sqrt":
            return f"√<span class=\"sqrt\">{self.group()}</span>"
        raise TexError(
            f"TeX command \\{name} (in ${tex}$) is not one the site knows: add it to "
            "website/tex.py (SYMBOLS for a symbol, FUNCTIONS for an upright name)"
        )
