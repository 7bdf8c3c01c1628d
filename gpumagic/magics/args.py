"""Argument parsing for the magics: bad input raises ``UsageError`` with the usage."""

from __future__ import annotations

import argparse
import io
import keyword
import re
import shlex
import tokenize
from typing import Any, NoReturn

from IPython.core.error import UsageError

_TOKEN = re.compile(r"\s*(\S+)")


class MagicParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are IPython ``UsageError``s carrying the usage."""

    def __init__(self, prog: str, description: str = "", **kw: Any) -> None:
        super().__init__(prog=prog, description=description, add_help=False, **kw)

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().rstrip()}")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise UsageError(message or self.format_usage())

    def usage_error(self, message: str) -> UsageError:
        return UsageError(f"{self.prog}: {message}\n{self.format_usage().rstrip()}")

    def check_variable(self, option: str, name: str | None) -> None:
        """A ``UsageError`` unless ``name`` (given with ``option``) is a variable code can
        read: ``-o class`` or ``-o None`` pass ``str.isidentifier()``, yet a result stored
        under a keyword is out of every cell's reach."""
        if name is not None and (not name.isidentifier() or keyword.iskeyword(name)):
            why = "a Python keyword" if keyword.iskeyword(name) else "not an identifier"
            raise self.usage_error(f"{option} {name!r}: not a valid variable name ({why})")

    def parse_line(self, line: str) -> argparse.Namespace:
        """Parse a whole line of options (a cell magic's first line)."""
        try:
            tokens = shlex.split(line)
        except ValueError as exc:  # unbalanced quotes
            raise self.usage_error(str(exc)) from None
        return self.parse_args(tokens)

    def parse_prefix(self, line: str) -> tuple[argparse.Namespace, str]:
        """Parse the options at the start of ``line``; return them and the raw rest
        (a line magic's statement, kept exactly as typed). ``--`` ends the options."""
        takes_value = {
            opt
            for action in self._actions
            if action.nargs != 0 and action.option_strings
            for opt in action.option_strings
        }
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
            if name not in self._option_string_actions:
                raise self.usage_error(f"unrecognized option: {tok}")
            tokens.append(tok)
            expect_value = name in takes_value and "=" not in tok
            pos = m.end()
        if expect_value:
            raise self.usage_error(f"option {tokens[-1]} expects a value")
        return self.parse_args(tokens), line[pos:].strip()


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
