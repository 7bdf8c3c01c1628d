"""Argument parsing for the magics: bad input raises ``UsageError`` with the usage, and the
magic's help (``%magic?``, ``-h`` on the magic's line) is generated from the parser.

Every option has a help text; :func:`documented` puts the parser's help between a magic's
summary line and the rest of its docstring, which is what IPython's inspector shows for
``%memtrace?``, and ``-h``/``--help`` on the magic's line prints the same text and runs
nothing. An option nobody declared is named in the error with the nearest real one
(``--intervall``: "did you mean --interval?"), never blamed on the value after it.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import io
import keyword
import re
import shlex
import tokenize
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

from IPython.core.error import UsageError

_TOKEN = re.compile(r"\s*(\S+)")
# A negative number is a value (``--wait -1``), never an option: argparse reads it the same
# way as long as no option looks like one.
_NEGATIVE = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
_HELP = ("-h", "--help")
F = TypeVar("F", bound=Callable[..., Any])


class _HelpFormatter(argparse.HelpFormatter):
    """A fixed width: the help becomes a docstring, the same wherever it is read (argparse
    would take the width of whatever terminal imported the module)."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=90, max_help_position=30)


class MagicParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are IPython ``UsageError``s carrying the usage.

    ``forms``: further usage lines, for a magic with more than one form (the line form of a
    cell magic, ``%gpuprofile --compare A B``); they follow the generated usage in the help.

    Every option has one spelling: argparse's abbreviations (any unique prefix of a long
    option) are off, so a prefix is not a second name (``--min-free`` for
    ``--min-free-memory``), nor one that changes meaning when an option is added.
    """

    def __init__(
        self, prog: str, description: str = "", forms: Sequence[str] = (), **kw: Any
    ) -> None:
        kw.setdefault("formatter_class", _HelpFormatter)
        kw.setdefault("allow_abbrev", False)
        super().__init__(prog=prog, description=description, add_help=False, **kw)
        self.forms = list(forms)
        self.doc = ""  # the magic's whole help, set by documented()
        self.add_argument(
            *_HELP, action="store_true", help="show this help (as %%magic? does) and run nothing"
        )

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().rstrip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or self.format_usage())

    def usage_error(self, message: str) -> UsageError:
        return UsageError(f"{self.prog}: {message}\n{self.format_usage().rstrip()}")

    def check_variable(self, option: str, name: str | None) -> None:
        """A ``UsageError`` unless ``name`` (given with ``option``) is a variable code can
        read: ``class`` or ``None`` pass ``str.isidentifier()``, yet no cell can name a
        variable so called."""
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            why = "a Python keyword" if keyword.iskeyword(name) else "not an identifier"
            raise self.usage_error(f"{option} {name!r}: not a valid variable name ({why})")

    def format_help(self) -> str:
        """argparse's help, with the magic's other forms under its usage line."""
        text = super().format_help()
        if not self.forms:
            return text
        usage, sep, rest = text.partition("\n\n")
        others = "".join(f"\n       {form}" for form in self.forms)
        return f"{usage}{others}{sep}{rest}"

    def help_text(self) -> str:
        """What ``-h`` prints: the magic's whole help (its docstring), else the parser's."""
        return self.doc or self.format_help()

    # -- parsing ---------------------------------------------------------------------------
    def parse_line(self, line: str) -> argparse.Namespace | None:
        """Parse a whole line of options (a cell magic's first line); None after ``-h``,
        whose help is printed."""
        try:
            tokens = shlex.split(line)
        except ValueError as exc:  # unbalanced quotes
            raise self.usage_error(str(exc)) from None
        if self._wants_help(tokens):
            return None
        self._check_options(tokens)
        return self.parse_args(tokens)

    def parse_prefix(self, line: str) -> tuple[argparse.Namespace, str] | None:
        """Parse the options at the start of ``line``; return them and the raw rest
        (a line magic's statement, kept exactly as typed). ``--`` ends the options. An option
        whose value is optional (``-o``) takes none here: what follows is the statement, as
        in ``%timeit -o STATEMENT``. None after ``-h``, whose help is printed."""
        pos = 0
        tokens: list[str] = []
        expect_value = False
        while True:
            m = _TOKEN.match(line, pos)
            if m is None:
                break
            tok = m.group(1)
            if expect_value:
                tokens.append(tok)
                pos = m.end()
                expect_value = False
                continue
            if tok == "--":
                pos = m.end()
                break
            if not tok.startswith("-") or tok == "-":
                break
            name = tok.split("=", 1)[0]
            action = self._option_string_actions.get(name)
            if action is None:
                raise self.usage_error(f"unrecognized option: {tok}{self._did_you_mean(name)}")
            tokens.append(tok)
            expect_value = action.nargs not in (0, "?") and "=" not in tok
            pos = m.end()
        if expect_value:
            raise self.usage_error(f"option {tokens[-1]} expects a value")
        if self._wants_help(tokens):
            return None
        return self.parse_args(tokens), line[pos:].strip()

    def _wants_help(self, tokens: Sequence[str]) -> bool:
        options = tokens[: tokens.index("--")] if "--" in tokens else tokens
        if not any(t in _HELP for t in options):
            return False
        print(self.help_text())
        return True

    def _check_options(self, tokens: Sequence[str]) -> None:
        """Name an option nobody declared before argparse sees it: argparse would set it
        aside and blame the value after it (``%gpuwatch --intervall 1`` said "invalid choice:
        '1'"). Values are skipped as argparse skips them."""
        i = 0
        while i < len(tokens):
            tok = tokens[i]
            i += 1
            if tok == "--":
                return
            if not tok.startswith("-") or tok == "-" or _NEGATIVE.match(tok):
                continue
            name, has_value = tok.split("=", 1)[0], "=" in tok
            action = self._known(name)
            if action is None:
                raise self.usage_error(
                    f"unrecognized arguments: {name}{self._did_you_mean(name)}"
                )
            if has_value or action.nargs == 0:
                continue
            if action.nargs == "?":  # a value only if one follows
                i += int(i < len(tokens) and not _is_option(tokens[i]))
            elif action.nargs is None or isinstance(action.nargs, int):
                i += action.nargs if isinstance(action.nargs, int) else 1
            else:  # "*" / "+": every value up to the next option
                while i < len(tokens) and not _is_option(tokens[i]):
                    i += 1

    def _known(self, name: str) -> argparse.Action | None:
        actions = self._option_string_actions
        if name in actions:
            return actions[name]
        if len(name) > 2 and not name.startswith("--") and name[:2] in actions:  # -qo: short flags run together
            return actions[name[:2]]
        return None

    def _did_you_mean(self, name: str) -> str:
        """The option meant: the one whose help names ``name`` (``--loop``: nvidia-smi's name
        for ``--interval``, which the help of --interval gives), else the nearest spelling."""
        named = re.compile(rf"(?<![\w-]){re.escape(name)}(?![\w-])")
        for action in self._actions:
            if action.help and named.search(action.help):
                meant = action.option_strings[-1] if action.option_strings else action.metavar
                return f" (did you mean {meant}?)"
        close = difflib.get_close_matches(name, list(self._option_string_actions), n=1, cutoff=0.6)
        return f" (did you mean {close[0]}?)" if close else ""


def _is_option(token: str) -> bool:
    return token.startswith("-") and token != "-" and not _NEGATIVE.match(token)


def documented(parser: MagicParser) -> Callable[[F], F]:
    """Give a magic the help its parser generates: the docstring becomes its summary line,
    the parser's help (every form, every option with its help text), then the rest of the
    docstring; ``-h`` on the magic's line prints the same. The function itself is returned
    (no wrapper: a cell's traceback has no extra frame)."""

    def decorate(fn: F) -> F:
        summary, _, prose = inspect.cleandoc(fn.__doc__ or "").partition("\n")
        parts = (summary.strip(), parser.format_help().rstrip(), inspect.cleandoc(prose))
        fn.__doc__ = parser.doc = "\n\n".join(p for p in parts if p)
        return fn

    return decorate


def output_option(parser: MagicParser, returns: str) -> None:
    """``-o``: as ``%timeit -o``, the magic returns its result (``returns`` says what that
    replaces)."""
    parser.add_argument(
        "-o",
        "--output",
        action="store_true",
        help="return the result, as %%timeit -o does (" + returns.replace("%", "%%") + ")",
    )


def returns_result(opts: argparse.Namespace) -> bool:
    """``-o`` was given: the magic returns its result (``%timeit -o``)."""
    return bool(opts.output)


# -- option values: argparse ``type=`` callables, whose ArgumentTypeError argparse reports as
# "argument --id: ..." through MagicParser.error, so a bad value is a UsageError with usage
def index_list(text: str) -> list[int]:
    """``0`` or ``0,1``: CUDA indexes, as nvidia-smi's ``--id`` takes them."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        ids = []
    if not ids or any(i < 0 for i in ids):
        raise argparse.ArgumentTypeError(f"takes CUDA indexes such as 0 or 0,1, got {text!r}")
    return ids


def whole_number(text: str) -> int:
    """A count such as ``2`` (its range is the caller's to check)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def percent(text: str) -> float:
    """``50`` or ``50%`` (its range is the caller's to check)."""
    from gpumagic.units import parse_percent

    try:
        return parse_percent(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def host_port(text: str) -> tuple[str, int]:
    """``PORT`` or ``HOST:PORT`` (``[::1]:9401`` too); the host defaults to 127.0.0.1."""
    host, _, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give PORT or HOST:PORT, like 9401 or 0.0.0.0:9401"
        ) from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r}: a port is a number from 0 to 65535")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or "127.0.0.1"), number


def without_silencer(line: str) -> str:
    """A line magic's options without the trailing ``;`` that silences its ``Out[]``.

    For a magic marked ``@output_can_be_silenced``, IPython drops the return value when the
    line's last token is ``;`` (a comment may follow), but only after the magic ran, and it
    passes the ``;`` on: ``%gpuenv ;`` calls the magic with ``";"``, which is no option.
    This cuts the line where IPython's own test (``DisplayHook.semicolon_at_end_of_expression``)
    finds that ``;``, so the two always agree. (``%gpuenv;`` without the space never gets
    here: IPython looks up a magic named ``gpuenv;``, as it does for ``%time;``.)
    """
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):
        return line  # IPython's test tokenizes too; such a line is no silenced one
    skip = (tokenize.ENDMARKER, tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT)
    for tok in reversed(tokens):
        if tok.type in skip:
            continue
        if tok.type == tokenize.OP and tok.string == ";" and tok.start[0] == 1:
            return line[: tok.start[1]]
        return line
    return line
