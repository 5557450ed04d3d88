"""The command line's one integer parser: a whole number within bounds, refused by argparse with a
message that says what was wrong (never a traceback, never a negative limit read as unlimited)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import NoReturn


@dataclass(frozen=True)
class WholeNumber:
    """An argparse `type=`: an int from `least` to `most` (None: no upper bound)."""

    least: int
    most: int | None = None
    not_a_number: str = "not a whole number"
    out_of_range: str = "must be at least {least}, got {value}"

    def __call__(self, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{self.not_a_number}: {text!r}") from None
        if value < self.least or (self.most is not None and value > self.most):
            raise argparse.ArgumentTypeError(self.out_of_range.format(least=self.least, most=self.most, value=value))
        return value


PORT = WholeNumber(0, 65535, "not a port number", "{value} is not a TCP port ({least}-{most})")  # 0: any free one
POSITIVE = WholeNumber(1)
COUNT = WholeNumber(0, out_of_range="must be 0 (unlimited) or more, got {value}")  # a limit: 0 is unlimited / none
NONNEGATIVE = WholeNumber(0, out_of_range="must be 0 or more, got {value}")  # a number of things: 0 is none


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusal is the whole usage block and then the error, so the one line that says
    what was wrong is the last of a dozen. A mistake here is one line, naming it and where the
    accepted values are listed, and exit status 2 as argparse gives."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")
